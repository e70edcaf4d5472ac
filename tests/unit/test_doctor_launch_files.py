"""The ready-to-run doctor launch files (examples/doctor/): each starts every rank under the
launch contract with `tb-doctor --cluster`, with arguments the shipped doctor accepts, and
the container settings its own checks ask for."""

import shlex
import subprocess

import pytest
import yaml

from .conftest import ROOT
from .doctor_fakes import import_doctor

import_doctor()
cli = __import__("trainbase_doctor.cli", fromlist=["x"])
HERE = ROOT / "examples" / "doctor"


def doctor_args(argv: list[str]) -> list[str]:
    """The arguments after `tb-launch tb-doctor`, parsed by the doctor's own parser."""
    assert "tb-doctor" in argv, argv
    i = argv.index("tb-doctor")
    assert argv[i - 1] == "tb-launch", f"tb-doctor must run under the launch contract: {argv}"
    args = argv[i + 1 :]
    parsed = cli.parser().parse_args(args)
    assert parsed.cluster, f"not in cluster mode: {args}"
    return args


def mpirun_argv(command: list[str]) -> tuple[list[str], str]:
    """The launcher's mpirun command line, and the shell lines before it (`sh -c "...; exec
    mpirun ..."`, or mpirun itself)."""
    if command[:2] != ["sh", "-c"]:
        return command, ""
    before, _, rest = command[2].partition("exec mpirun ")
    return ["mpirun", *shlex.split(rest)], before


def test_mpijob_launches_one_rank_per_slot_under_the_contract():
    job = yaml.safe_load((HERE / "mpijob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    cmd, before = mpirun_argv(spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"])
    doctor_args(cmd)
    workers = spec["mpiReplicaSpecs"]["Worker"]
    assert int(cmd[cmd.index("-np") + 1]) == workers["replicas"] * spec["slotsPerWorker"]
    assert cmd[cmd.index("--map-by") + 1] == f"ppr:{spec['slotsPerWorker']}:node"
    # the first worker as the operator's hostfile names it: its service is `<job>` since MPI
    # Operator 0.5 and was `<job>-worker` before, so no DNS name is written out here
    assert cmd[cmd.index("--hostfile") + 1] == "/etc/mpi/hostfile"
    assert "read -r MASTER_ADDR _ < /etc/mpi/hostfile && export MASTER_ADDR" in before
    assert cmd[cmd.index("-x") + 1] == "MASTER_ADDR"
    pod = workers["template"]["spec"]
    c = pod["containers"][0]
    # the operator reaches workers over SSH: they run sshd, with host keys made at start
    assert "ssh-keygen -A" in c["command"][-1] and "sshd -De" in c["command"][-1]
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
    shm = next(
        v
        for v in pod["volumes"]
        if v["name"] == next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
    )
    assert shm["emptyDir"]["medium"] == "Memory"


def test_slurm_script_runs_the_doctor_on_every_task():
    text = (HERE / "slurm.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(HERE / "slurm.sbatch")], check=False).returncode == 0
    srun = " ".join(ln.rstrip("\\").strip() for ln in text.split("srun ", 1)[1].splitlines()[:2])
    argv = shlex.split("srun " + srun)
    assert "--mpi=pmix" in argv and any(a.startswith("--container-image=") for a in argv)
    doctor_args(argv)


def test_azureml_job_is_an_mpi_command_job():
    job = yaml.safe_load((HERE / "azureml-job.yml").read_text())
    assert job["type"] == "command" and job["$schema"].endswith("commandJob.schema.json")
    assert job["distribution"]["type"] == "mpi" and job["resources"]["instance_count"] >= 2
    assert "image" in job["environment"] and "base_image" not in str(job)
    doctor_args(shlex.split(job["command"]))


@pytest.mark.parametrize("bad", [["--cluster", "--expect", "infiniband"], ["--allreduce"]])
def test_the_parser_refuses_what_the_files_must_not_say(bad, capsys):
    with pytest.raises(SystemExit):
        cli.main(bad)


def test_slurm_script_asks_for_the_pmi_the_doctor_names():
    """Under `srun --mpi=none` the doctor fails the two singletons naming the flag this file
    uses; with that flag's environment (PMIx) the same world passes."""
    cluster = __import__("trainbase_doctor.cluster", fromlist=["x"])
    text = (HERE / "slurm.sbatch").read_text()
    argv = shlex.split("srun " + " ".join(ln.rstrip("\\").strip() for ln in text.split("srun ", 1)[1].splitlines()[:2]))
    flag = next(a for a in argv if a.startswith("--mpi="))
    slurm = {"SLURM_NTASKS": "16", "SLURM_PROCID": "0"}
    bare = cluster.world_check(1, slurm)
    assert bare["status"] == "fail" and f"`srun {flag}`" in bare["hint"]
    assert cluster.world_check(16, {**slurm, "PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.1.0"})["status"] == "ok"
