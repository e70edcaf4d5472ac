"""The framework checks (test_frameworks.py, test_lightning.py) run unchanged on fake containers
(tests/unit/framework_fakes.py), so that each is shown failing for its own reason without an
image: for every check, the output of a healthy image passes and the output a given defect
produces fails with the message the check gives for it. The defects are the ones each check
exists for: a launch contract that gets NODE_RANK wrong, torchrun or TF workers that each form
a world of their own, a CPU-only TensorFlow, Horovod without its MPI controller, DeepSpeed built
without its ops, Lightning picking the wrong environment or hanging on a mismatch."""
from __future__ import annotations

import json
import re

import pytest

from trainbase_conformance.checks import test_frameworks as fw
from trainbase_conformance.checks import test_lightning as lt

from .framework_fakes import FakeTarget, cluster, ddp, deepspeed, horovod, lightning, tf_worker

PYTORCH = {"pytorch": "2.10.0"}
LIGHTNING = {"pytorch": {"lightning": "2.6.0"}}


def launched(out: str, rc: int = 0, stderr: str = ""):
    """A fake cluster whose mpirun across a and b prints ``out`` and exits ``rc``."""
    return cluster(lambda node, cmd, env: (rc, out, stderr))


# ----------------------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("broken", [False, True])
def test_ddp_across_two_containers_fails_on_a_wrong_node_rank(broken):
    """A contract that gives every rank NODE_RANK=0: DDP still trains (gloo needs only RANK and
    WORLD_SIZE), so the last assertion is what catches it."""
    out = "".join(ddp(r, node_rank=0 if broken else None) for r in range(4))
    run = lambda: fw.test_pytorch_per_process_mpirun_across_two_containers(launched(out), FakeTarget(PYTORCH))  # noqa: E731
    if not broken:
        return run()
    with pytest.raises(AssertionError, match=r"\(rank, NODE_RANK\) \[\('0', '0'\), \('1', '0'\), \('2', '0'\), "
                                             r"\('3', '0'\)\]: ranks 0-1 run in container a \(node 0\), 2-3 in b"):
        run()


@pytest.mark.parametrize("broken", [False, True])
def test_torchrun_per_node_fails_when_each_node_trains_a_world_of_its_own(broken):
    """torchrun that never joined the other node (a standalone world of 2 on each)."""
    def answer(node, cmd, env):
        assert f"--node-rank {node}" in cmd
        if broken:
            return 0, ddp(0, world=2) + ddp(1, world=2)
        return 0, ddp(2 * node) + ddp(2 * node + 1)

    run = lambda: fw.test_pytorch_per_node_torchrun_in_each_container(cluster(answer), FakeTarget(PYTORCH))  # noqa: E731
    if not broken:
        return run()
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0, 1, 1\], want 0\.\.3"):
        run()


# ----------------------------------------------------------------------------- TensorFlow

def tf_build(gpu_build: bool):
    def answer(node, cmd, env):
        if "get_build_info" in cmd:
            return 0, json.dumps({"version": "2.20.0", "cuda": "12.5.1", "cudnn": "9", "gpu_build": gpu_build}) + "\n"
        assert "WHEEL" in cmd, cmd
        return 0, json.dumps({"tags": ["cp311-cp311-manylinux_2_17_x86_64"], "machine": "x86_64"}) + "\n"
    return answer


def test_tensorflow_build_check_fails_on_a_cpu_only_wheel():
    target = FakeTarget({"tensorflow": "2.20.0"}, tf_build(True))
    fw.test_tensorflow_build_matches_manifest(target)
    target = FakeTarget({"tensorflow": "2.20.0"}, tf_build(False))
    with pytest.raises(AssertionError, match=r"this TensorFlow is built without CUDA \(a CPU-only wheel\): "
                                             r"\{'version': '2\.20\.0', .*'gpu_build': False\}"):
        fw.test_tensorflow_build_matches_manifest(target)


def test_tensorflow_multiworker_fails_when_each_worker_is_alone():
    """tb-launch --tf that ignores TRAINBASE_HOSTS: each worker a TF_CONFIG of one."""
    target = FakeTarget({"tensorflow": "2.20.0"})
    fw.test_tensorflow_multiworker_across_two_containers(launched(tf_worker(0, 2) + tf_worker(1, 2)), target)
    with pytest.raises(AssertionError, match=r"workers that reported OK: \[0, 0\], want 0\.\.1"):
        fw.test_tensorflow_multiworker_across_two_containers(launched(tf_worker(0, 1) * 2), target)


# ----------------------------------------------------------------------------- Horovod

CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [{mpi}] MPI
    [X] Gloo

Available Tensor Operations:
    [X] NCCL
    [ ] DDL
    [ ] CCL
    [{mpi}] MPI
    [X] Gloo
"""


def horovod_build(mpi: bool):
    def answer(node, cmd, env):
        if cmd.startswith("horovodrun --check-build"):
            return 0, CHECK_BUILD.format(mpi="X" if mpi else " ")
        return 0, json.dumps({"version": "0.28.1", "mpi": mpi, "gloo": True}) + "\n"
    return answer


def test_horovod_build_check_fails_without_the_mpi_controller():
    fw.test_horovod_check_build_shows_claimed_frameworks_and_controllers(FakeTarget({"horovod": "0.28.1"}, horovod_build(True)))
    with pytest.raises(AssertionError, match=r"horovodrun --check-build lacks \['MPI'\]"):
        fw.test_horovod_check_build_shows_claimed_frameworks_and_controllers(
            FakeTarget({"horovod": "0.28.1"}, horovod_build(False)))


def test_horovod_allreduce_fails_when_every_rank_is_a_world_of_one():
    """Horovod whose MPI controller cannot init: each process runs alone (size 1)."""
    target = FakeTarget({"horovod": "0.28.1"})
    fw.test_horovod_allreduce_four_ranks_across_two_containers(
        launched("".join(horovod(r, 4, r % 2) for r in range(4))), target)
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0, 0, 0\], want 0\.\.3"):
        fw.test_horovod_allreduce_four_ranks_across_two_containers(launched(horovod(0, 1) * 4), target)


# ----------------------------------------------------------------------------- DeepSpeed

def ds_report(installed: bool) -> str:
    mark = "[YES]" if installed else "[NO]"
    return ("--------------------------------------------------\nDeepSpeed C++/CUDA extension op report\n"
            f"cpu_adam ............... {mark} ...... [OKAY]\nfused_adam ............. {mark} ...... [OKAY]\n"
            "deepspeed info ................... 0.18.2, unknown, unknown\n")


def test_deepspeed_report_fails_when_the_prebuilt_ops_are_not_installed():
    """DeepSpeed reinstalled with DS_BUILD_OPS=0: ds_report lists its ops, none installed."""
    ops = {"deepspeed": ["cpu_adam", "fused_adam"]}
    for installed in (True, False):
        target = FakeTarget({"deepspeed": "0.18.2"}, lambda n, c, e, i=installed: (0, ds_report(i)), prebuilt_ops=ops)
        if installed:
            fw.test_deepspeed_report_lists_the_prebuilt_ops_as_installed(target)
            continue
        with pytest.raises(AssertionError, match=r"ds_report does not list these prebuilt ops as installed: "
                                                 r"\{'cpu_adam': 'NO', 'fused_adam': 'NO'\}"):
            fw.test_deepspeed_report_lists_the_prebuilt_ops_as_installed(target)


def test_deepspeed_init_fails_when_every_rank_is_a_world_of_one():
    target = FakeTarget({"deepspeed": "0.18.2"})
    fw.test_deepspeed_init_distributed_under_mpirun(launched("".join(deepspeed(r, 4, r % 2) for r in range(4))), target)
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0, 0, 0\], want 0\.\.3"):
        fw.test_deepspeed_init_distributed_under_mpirun(launched(deepspeed(0, 1) * 4), target)


# ----------------------------------------------------------------------------- Lightning

def lightning_image(answer=None) -> FakeTarget:
    return FakeTarget(PYTORCH, answer, packages=LIGHTNING)


def test_lightning_alone_fails_in_another_environment():
    """Lightning that takes MPIEnvironment (mpi4py is in the image) with no launcher."""
    lt.test_lightning_example_runs_as_one_process_without_a_launcher(
        lightning_image(lambda n, c, e: (0, lightning(0, 1, "LightningEnvironment"))))
    with pytest.raises(AssertionError, match=r"without a launcher Lightning must train a world of 1 in its own "
                                             r"LightningEnvironment: \{'rank': '0', 'world': '1', .*'env': 'MPIEnvironment'"):
        lt.test_lightning_example_runs_as_one_process_without_a_launcher(
            lightning_image(lambda n, c, e: (0, lightning(0, 1, "MPIEnvironment"))))


def test_lightning_under_the_contract_fails_as_two_independent_jobs():
    """The contract's Lightning patch removed: each rank trains a world of 1."""
    ok = lightning(0, 2, "TorchElasticEnvironment", per_node=1) + lightning(1, 2, "TorchElasticEnvironment", per_node=1)
    lt.test_lightning_ddp_per_process_mpirun_with_the_contract(launched(ok), lightning_image())
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0\], want 0\.\.1"):
        lt.test_lightning_ddp_per_process_mpirun_with_the_contract(
            launched(lightning(0, 1, "LightningEnvironment") * 2), lightning_image())


def test_lightning_devices_mismatch_fails_when_rank_0_hangs():
    """One rank raised Lightning's error, rank 0 waited until `timeout` killed the job (124)."""
    error = "lightning_fabric.utilities.exceptions.MisconfigurationException: ... does not match the world size"
    lt.test_lightning_devices_mismatch_fails_loudly_on_every_rank(launched("", 1, error), lightning_image())
    with pytest.raises(AssertionError, match=r"exit 124 \(124: hung until killed\)"):
        lt.test_lightning_devices_mismatch_fails_loudly_on_every_rank(launched("", 124, error), lightning_image())


def test_lightning_azureml_per_node_recipe_fails_on_mpi_s_world_of_two():
    """Unpatched, Lightning took MPI's world of 2; the example then refuses to call it a success."""
    full = "".join(lightning(r, 4, "LightningEnvironment") for r in range(4))
    lt.test_lightning_azureml_per_node_recipe_trains_the_full_world(launched(full), lightning_image())
    half = "".join(f"FAIL rank={r} reason=Lightning trained a world of 2, devices x num_nodes = 4 (MPIEnvironment)\n"
                   for r in range(2))
    with pytest.raises(AssertionError, match=r"exit 1, \['Lightning trained a world of 2, devices x num_nodes = 4"):
        lt.test_lightning_azureml_per_node_recipe_trains_the_full_world(launched(half, 1), lightning_image())


def test_lightning_azureml_per_process_recipe_fails_in_another_environment():
    """Lightning that ignores MPI's world: the 4 processes form it through torchelastic variables
    a launcher left behind, not through MPI."""
    mpi = "".join(lightning(r, 4, "MPIEnvironment") for r in range(4))
    lt.test_lightning_azureml_per_process_recipe_without_tb_launch(launched(mpi), lightning_image())
    other = "".join(lightning(r, 4, "TorchElasticEnvironment") for r in range(4))
    with pytest.raises(AssertionError, match=r"without tb-launch Lightning must take the launcher's world from MPI "
                                             r"\(MPIEnvironment\)"):
        lt.test_lightning_azureml_per_process_recipe_without_tb_launch(launched(other), lightning_image())


def test_lightning_azureml_mismatch_fails_when_no_rank_names_the_fix():
    fix = ("FAIL rank={r} reason=MPI started 2 process(es), Trainer wants devices x num_nodes = 4: set "
           "process_count_per_node=2, or run per node with NODE_RANK set\n")
    lt.test_lightning_azureml_per_process_mismatch_stops_with_the_fix(
        launched(fix.format(r=0) + fix.format(r=1), 1), lightning_image())
    bare = "".join(f"FAIL rank={r} reason=ValueError: world size 2 does not match devices x num_nodes\n" for r in range(2))
    with pytest.raises(AssertionError, match=re.escape("no rank named the fix: ['ValueError: world size 2")):
        lt.test_lightning_azureml_per_process_mismatch_stops_with_the_fix(launched(bare, 1), lightning_image())
