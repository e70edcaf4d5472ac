"""The runtime tier's srun loops (test_srun_apptainer, test_srun_enroot) run once per PMI both
the image's MPI and the host's Slurm speak: with none in common they must not pass having run
nothing, but skip saying which side speaks what (slurm.pmi_in_common)."""

import pytest

from trainbase_conformance import slurm
from trainbase_conformance.checks.test_runtime import SLURM_PMI


@pytest.mark.parametrize(
    "kind, offered, common",
    [
        ("openmpi", ["none", "pmi2", "pmix"], ["pmix"]),
        ("intelmpi", ["none", "pmi2", "pmix"], ["pmi2", "pmix"]),
        ("intelmpi", ["none", "pmi2"], ["pmi2"]),
    ],
)
def test_the_loop_runs_each_pmi_both_sides_speak(kind, offered, common):
    assert slurm.pmi_in_common(kind, SLURM_PMI[kind], offered) == (common, "")


def test_no_pmi_in_common_says_which_side_speaks_what():
    common, why = slurm.pmi_in_common("openmpi", SLURM_PMI["openmpi"], ["none", "pmi2"])
    assert common == []
    assert why == "no PMI in common: the image's openmpi speaks pmix, this Slurm offers none, pmi2 (srun --mpi=list)"
    _, why = slurm.pmi_in_common("mpich", set(), [])
    assert "the image's mpich speaks none this suite knows, this Slurm offers nothing" in why


def test_the_checks_skip_with_that_reason():
    """The helper both srun checks loop over: an empty overlap is a skip with the reason, never
    an empty loop that passes."""
    from types import SimpleNamespace

    from trainbase_conformance.checks import test_runtime

    target = SimpleNamespace(need_mpi=lambda: SimpleNamespace(kind="openmpi"))
    cluster = SimpleNamespace(mpi_plugins=lambda: ["none", "pmi2"])
    with pytest.raises(pytest.skip.Exception, match="the image's openmpi speaks pmix, this Slurm offers none, pmi2"):
        test_runtime._pmi_in_common(target, cluster)
    assert test_runtime._pmi_in_common(target, SimpleNamespace(mpi_plugins=lambda: ["pmix"])) == ["pmix"]
