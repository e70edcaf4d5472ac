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
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_frameworks as fw
from trainbase_conformance.checks import test_lightning as lt

from .framework_fakes import PARAMS, FakeTarget, cluster, ddp, deepspeed, horovod, lightning, tf_worker

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
    with pytest.raises(
        AssertionError,
        match=r"\(rank, NODE_RANK\) \[\('0', '0'\), \('1', '0'\), \('2', '0'\), "
        r"\('3', '0'\)\]: ranks 0-1 run in container a \(node 0\), 2-3 in b",
    ):
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
    with pytest.raises(
        AssertionError,
        match=r"this TensorFlow is built without CUDA \(a CPU-only wheel\): "
        r"\{'version': '2\.20\.0', .*'gpu_build': False\}",
    ):
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
    fw.test_horovod_check_build_shows_claimed_frameworks_and_controllers(
        FakeTarget({"horovod": "0.28.1"}, horovod_build(True))
    )
    with pytest.raises(AssertionError, match=r"horovodrun --check-build lacks \['MPI'\]"):
        fw.test_horovod_check_build_shows_claimed_frameworks_and_controllers(
            FakeTarget({"horovod": "0.28.1"}, horovod_build(False))
        )


def test_horovod_allreduce_fails_when_every_rank_is_a_world_of_one():
    """Horovod whose MPI controller cannot init: each process runs alone (size 1)."""
    target = FakeTarget({"horovod": "0.28.1"})
    fw.test_horovod_allreduce_four_ranks_across_two_containers(
        launched("".join(horovod(r, 4, r % 2) for r in range(4))), target
    )
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0, 0, 0\], want 0\.\.3"):
        fw.test_horovod_allreduce_four_ranks_across_two_containers(launched(horovod(0, 1) * 4), target)


# ----------------------------------------------------------------------------- DeepSpeed


def ds_report(installed: bool) -> str:
    mark = "[YES]" if installed else "[NO]"
    return (
        "--------------------------------------------------\nDeepSpeed C++/CUDA extension op report\n"
        f"cpu_adam ............... {mark} ...... [OKAY]\nfused_adam ............. {mark} ...... [OKAY]\n"
        "deepspeed info ................... 0.18.2, unknown, unknown\n"
    )


def test_deepspeed_report_fails_when_the_prebuilt_ops_are_not_installed():
    """DeepSpeed reinstalled with DS_BUILD_OPS=0: ds_report lists its ops, none installed."""
    ops = {"deepspeed": ["cpu_adam", "fused_adam"]}
    for installed in (True, False):
        target = FakeTarget({"deepspeed": "0.18.2"}, lambda n, c, e, i=installed: (0, ds_report(i)), prebuilt_ops=ops)
        if installed:
            fw.test_deepspeed_report_lists_the_prebuilt_ops_as_installed(target)
            continue
        with pytest.raises(
            AssertionError,
            match=r"ds_report does not list these prebuilt ops as installed: "
            r"\{'cpu_adam': 'NO', 'fused_adam': 'NO'\}",
        ):
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
        lightning_image(lambda n, c, e: (0, lightning(0, 1, "LightningEnvironment")))
    )
    with pytest.raises(
        AssertionError,
        match=r"without a launcher Lightning must train a world of 1 in its own "
        r"LightningEnvironment: \{'rank': '0', 'world': '1', .*'env': 'MPIEnvironment'",
    ):
        lt.test_lightning_example_runs_as_one_process_without_a_launcher(
            lightning_image(lambda n, c, e: (0, lightning(0, 1, "MPIEnvironment")))
        )


def test_lightning_under_the_contract_fails_as_two_independent_jobs():
    """The contract's Lightning patch removed: each rank trains a world of 1."""
    ok = lightning(0, 2, "TorchElasticEnvironment", per_node=1) + lightning(1, 2, "TorchElasticEnvironment", per_node=1)
    lt.test_lightning_ddp_per_process_mpirun_with_the_contract(launched(ok), lightning_image())
    with pytest.raises(AssertionError, match=r"ranks that reported OK: \[0, 0\], want 0\.\.1"):
        lt.test_lightning_ddp_per_process_mpirun_with_the_contract(
            launched(lightning(0, 1, "LightningEnvironment") * 2), lightning_image()
        )


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
    half = "".join(
        f"FAIL rank={r} reason=Lightning trained a world of 2, devices x num_nodes = 4 (MPIEnvironment)\n"
        for r in range(2)
    )
    with pytest.raises(AssertionError, match=r"exit 1, \['Lightning trained a world of 2, devices x num_nodes = 4"):
        lt.test_lightning_azureml_per_node_recipe_trains_the_full_world(launched(half, 1), lightning_image())


def test_lightning_azureml_per_process_recipe_fails_in_another_environment():
    """Lightning that ignores MPI's world: the 4 processes form it through torchelastic variables
    a launcher left behind, not through MPI."""
    mpi = "".join(lightning(r, 4, "MPIEnvironment") for r in range(4))
    lt.test_lightning_azureml_per_process_recipe_without_tb_launch(launched(mpi), lightning_image())
    other = "".join(lightning(r, 4, "TorchElasticEnvironment") for r in range(4))
    with pytest.raises(
        AssertionError,
        match=r"without tb-launch Lightning must take the launcher's world from MPI "
        r"\(MPIEnvironment\)",
    ):
        lt.test_lightning_azureml_per_process_recipe_without_tb_launch(launched(other), lightning_image())


def test_lightning_azureml_mismatch_fails_when_no_rank_names_the_fix():
    fix = (
        "FAIL rank={r} reason=MPI started 2 process(es), Trainer wants devices x num_nodes = 4: set "
        "process_count_per_node=2, or run per node with NODE_RANK set\n"
    )
    lt.test_lightning_azureml_per_process_mismatch_stops_with_the_fix(
        launched(fix.format(r=0) + fix.format(r=1), 1), lightning_image()
    )
    bare = "".join(
        f"FAIL rank={r} reason=ValueError: world size 2 does not match devices x num_nodes\n" for r in range(2)
    )
    with pytest.raises(AssertionError, match=re.escape("no rank named the fix: ['ValueError: world size 2")):
        lt.test_lightning_azureml_per_process_mismatch_stops_with_the_fix(launched(bare, 1), lightning_image())


# ----------------------------------------------------------------------------- each assert, its own defect
# One defect per assert of the checks above, each in the examples' or the tool's own output, and
# each caught by the message of the assert that exists for it (so the mutation run,
# tests/conformance/mutation.py, sees every one of those asserts killed when it is removed).


def ddp_ranks(**kw) -> str:
    return "".join(ddp(r, **kw) for r in range(4))


@pytest.mark.parametrize(
    "rc, out, message",
    [
        # every rank trained, then the job died at teardown (an MPI_Finalize that segfaults)
        (139, ddp_ranks(), r"mpirun noticed that process rank 2 .* exited on signal 11"),
        # ranks 0..3, numbered right, in two worlds of 2 whose all-reduce gives 3
        (
            0,
            "".join(ddp(r, world=2, allreduce=3) for r in range(4)),
            r"want a world of 4 whose all-reduce of 1\.\.4 gives 10",
        ),
        # one world of 4, but rank 3 started from other parameters (a seed per rank)
        (
            0,
            "".join(ddp(r, params="0badc0ffee00" if r == 3 else PARAMS) for r in range(4)),
            r"the ranks' parameters differ",
        ),
    ],
    ids=["exit-139", "two-worlds-of-2", "params-differ"],
)
def test_ddp_across_two_containers_fails_on_each_defect(rc, out, message):
    died = "mpirun noticed that process rank 2 with PID 0 on node b exited on signal 11 (Segmentation fault).\n"
    with pytest.raises(AssertionError, match=message):
        fw.test_pytorch_per_process_mpirun_across_two_containers(
            launched(out, rc, died if rc else ""), FakeTarget(PYTORCH)
        )


@pytest.mark.parametrize(
    "defect, message",
    [
        ("exit", r"node 1: OK rank=2"),
        ("params", r"want one set of parameters and the all-reduce of 1\.\.4 \(10\) on every rank"),
        ("allreduce", r"want one set of parameters and the all-reduce of 1\.\.4 \(10\) on every rank"),
    ],
)
def test_torchrun_per_node_fails_on_each_defect(defect, message):
    def answer(node, cmd, env):
        lines = ddp(
            2 * node,
            params="1" * 12 if defect == "params" and node else PARAMS,
            allreduce=4 if defect == "allreduce" else None,
        ) + ddp(2 * node + 1)
        return (1 if defect == "exit" and node else 0), lines

    with pytest.raises(AssertionError, match=message):
        fw.test_pytorch_per_node_torchrun_in_each_container(cluster(answer), FakeTarget(PYTORCH))


def test_torchrun_over_nccl_fails_when_it_exits_non_zero_after_every_rank_reported():
    """NCCL's watchdog aborting at destroy_process_group: every rank printed OK, torchrun exits 1."""

    def answer(node, cmd, env):
        if "device_count" in cmd:
            return 0, "2\n"
        return (
            1,
            "".join(ddp(r, world=2) for r in range(2)),
            "[rank1]: NCCL watchdog thread terminated with exception\n",
        )

    target = FakeTarget(PYTORCH, answer)
    target.caps = SimpleNamespace(gpu_count=2)
    with pytest.raises(
        AssertionError, match=r"torchrun --nproc-per-node 2 over NCCL exited 1: \[rank1\]: NCCL watchdog"
    ):
        fw.test_pytorch_nccl_allreduce_on_all_local_gpus(target)


@pytest.mark.parametrize(
    "build, wheel_tag, message",
    [
        ({"version": "2.19.0"}, "x86_64", r"tensorflow 2\.19\.0 in the image, the manifest says 2\.20\.0"),
        ({"cuda": "11.8"}, "x86_64", r"TensorFlow is built for CUDA 11\.8, the manifest says CUDA 12\.8\.1"),
        ({"cudnn": "8"}, "x86_64", r"TensorFlow is built for cuDNN 8, the manifest says cuDNN 9\.10\.2\.21"),
        ({}, "aarch64", r"tensorflow's wheel is built for aarch64, the image runs x86_64"),
    ],
    ids=["version", "cuda", "cudnn", "machine"],
)
def test_tensorflow_build_check_fails_on_each_mismatch(build, wheel_tag, message):
    def answer(node, cmd, env):
        if "get_build_info" in cmd:
            info = {"version": "2.20.0", "cuda": "12.5.1", "cudnn": "9", "gpu_build": True, **build}
            return 0, json.dumps(info) + "\n"
        return 0, json.dumps({"tags": [f"cp311-cp311-manylinux_2_17_{wheel_tag}"], "machine": "x86_64"}) + "\n"

    with pytest.raises(AssertionError, match=message):
        fw.test_tensorflow_build_matches_manifest(FakeTarget({"tensorflow": "2.20.0"}, answer))


@pytest.mark.parametrize(
    "rc, out, message",
    [
        (1, tf_worker(0, 2) + tf_worker(1, 2), r"OK worker=0 workers=2"),
        (
            0,
            tf_worker(0, 2).replace("allreduce=3", "allreduce=1")
            + tf_worker(1, 2).replace("allreduce=3", "allreduce=2"),
            r"the all-reduce of 1 and 2 over both workers must give 3 on each",
        ),
    ],
    ids=["exit-1", "no-all-reduce"],
)
def test_tensorflow_multiworker_fails_on_each_defect(rc, out, message):
    with pytest.raises(AssertionError, match=message):
        fw.test_tensorflow_multiworker_across_two_containers(launched(out, rc), FakeTarget({"tensorflow": "2.20.0"}))


@pytest.mark.parametrize(
    "rc, check_build, info, message",
    [
        (1, "", {}, r"horovodrun --check-build exited 1: ImportError: libmpi\.so\.40"),
        (0, CHECK_BUILD.replace("v0.28.1", "v0.28.0"), {}, r"horovodrun --check-build does not say Horovod v0\.28\.1"),
        (0, None, {"gloo": False}, r"horovod\.torch reports \{'version': '0\.28\.1', 'mpi': True, 'gloo': False\}"),
        (0, None, {"version": "0.28.0"}, r"horovod\.torch reports \{'version': '0\.28\.0'"),
    ],
    ids=["exit-1", "other-version", "extension-without-gloo", "extension-of-another-version"],
)
def test_horovod_build_check_fails_on_each_defect(rc, check_build, info, message):
    def answer(node, cmd, env):
        if cmd.startswith("horovodrun --check-build"):
            text = CHECK_BUILD.format(mpi="X") if check_build is None else check_build.format(mpi="X")
            return rc, text, "ImportError: libmpi.so.40: cannot open shared object file\n" if rc else ""
        return 0, json.dumps({"version": "0.28.1", "mpi": True, "gloo": True, **info}) + "\n"

    with pytest.raises(AssertionError, match=message):
        fw.test_horovod_check_build_shows_claimed_frameworks_and_controllers(FakeTarget({"horovod": "0.28.1"}, answer))


@pytest.mark.parametrize(
    "rc, out, message",
    [
        (1, "".join(horovod(r, 4, r % 2) for r in range(4)), r"OK rank=0 size=4"),
        (
            0,
            "".join(horovod(r, 4, r % 2).replace("allreduce=10", "allreduce=3") for r in range(4)),
            r"want one Horovod world of 4 whose all-reduce of 1\.\.4 gives 10",
        ),
    ],
    ids=["exit-1", "wrong-sum"],
)
def test_horovod_allreduce_fails_on_each_defect(rc, out, message):
    with pytest.raises(AssertionError, match=message):
        fw.test_horovod_allreduce_four_ranks_across_two_containers(launched(out, rc), FakeTarget({"horovod": "0.28.1"}))


@pytest.mark.parametrize(
    "rc, report, message",
    [
        # ds_report printed its table, then died on the accelerator probe
        (1, ds_report(True), r"RuntimeError: found no NVIDIA driver"),
        (0, ds_report(True).replace("0.18.2", "0.17.6"), r"deepspeed info \.+ 0\.17\.6"),
    ],
    ids=["exit-1", "other-version"],
)
def test_deepspeed_report_fails_on_each_defect(rc, report, message):
    target = FakeTarget(
        {"deepspeed": "0.18.2"},
        lambda n, c, e: (rc, report, "RuntimeError: found no NVIDIA driver\n"),
        prebuilt_ops={"deepspeed": ["cpu_adam", "fused_adam"]},
    )
    with pytest.raises(AssertionError, match=message):
        fw.test_deepspeed_report_lists_the_prebuilt_ops_as_installed(target)


@pytest.mark.parametrize(
    "rc, out, message",
    [
        (1, "".join(deepspeed(r, 4, r % 2) for r in range(4)), r"OK rank=0 world=4"),
        (
            0,
            "".join(deepspeed(r, 4, r % 2).replace("world=4", "world=2") for r in range(4)),
            r"init_distributed must give every rank the world of 4",
        ),
    ],
    ids=["exit-1", "world-2"],
)
def test_deepspeed_init_fails_on_each_defect(rc, out, message):
    with pytest.raises(AssertionError, match=message):
        fw.test_deepspeed_init_distributed_under_mpirun(launched(out, rc), FakeTarget({"deepspeed": "0.18.2"}))


@pytest.mark.parametrize(
    "rc, out, message",
    [
        (1, lightning(0, 1, "LightningEnvironment"), r"Segmentation fault"),
        (0, lightning(0, 1, "LightningEnvironment") * 2, r"one process, one OK line"),
    ],
    ids=["exit-1", "two-ok-lines"],
)
def test_lightning_alone_fails_on_each_defect(rc, out, message):
    image = lightning_image(lambda n, c, e: (rc, out, "Segmentation fault (core dumped)\n" if rc else ""))
    with pytest.raises(AssertionError, match=message):
        lt.test_lightning_example_runs_as_one_process_without_a_launcher(image)


@pytest.mark.parametrize(
    "rc, out, message",
    [
        (1, "".join(lightning(r, 2, "TorchElasticEnvironment", per_node=1) for r in range(2)), r"OK rank=0 world=2"),
        # one world of 2, both ranks told NODE_RANK=0 (the contract's node index lost)
        (
            0,
            "".join(lightning(r, 2, "TorchElasticEnvironment", per_node=2) for r in range(2)),
            r"want rank 0 on node 0 and rank 1 on node 1",
        ),
    ],
    ids=["exit-1", "both-on-node-0"],
)
def test_lightning_under_the_contract_fails_on_each_defect(rc, out, message):
    with pytest.raises(AssertionError, match=message):
        lt.test_lightning_ddp_per_process_mpirun_with_the_contract(launched(out, rc), lightning_image())


@pytest.mark.parametrize(
    "out, stderr, message",
    [
        # every rank stopped, with another error than Lightning's mismatch
        ("", "RuntimeError: Connection reset by peer\n", r"RuntimeError: Connection reset by peer"),
        # the ranks stopped with Lightning's reason, but one had trained first
        (
            lightning(0, 2, "TorchElasticEnvironment", per_node=1),
            "... does not match the world size\n",
            r"a rank trained although devices did not match the launch",
        ),
    ],
    ids=["other-error", "a-rank-trained"],
)
def test_lightning_devices_mismatch_fails_on_each_defect(out, stderr, message):
    with pytest.raises(AssertionError, match=message):
        lt.test_lightning_devices_mismatch_fails_loudly_on_every_rank(launched(out, 1, stderr), lightning_image())


def test_lightning_azureml_per_node_recipe_fails_when_its_4_ranks_share_one_node():
    """One world of 4 with one set of parameters, but every process on node 0 (local ranks 0..3):
    NODE_RANK lost, node b trained nothing of its own."""
    crowded = "".join(lightning(r, 4, "LightningEnvironment", per_node=4) for r in range(4))
    with pytest.raises(
        AssertionError,
        match=re.escape(
            "(node rank, local rank) [('0', '0'), ('0', '1'), ('0', '2'), "
            "('0', '3')]: want 2 processes on each of the 2 nodes"
        ),
    ):
        lt.test_lightning_azureml_per_node_recipe_trains_the_full_world(launched(crowded), lightning_image())


def test_lightning_azureml_per_process_recipe_fails_when_mpirun_exits_non_zero_after_training():
    mpi = "".join(lightning(r, 4, "MPIEnvironment") for r in range(4))
    with pytest.raises(AssertionError, match=r"exit 1, \[\]"):
        lt.test_lightning_azureml_per_process_recipe_without_tb_launch(launched(mpi, 1), lightning_image())


@pytest.mark.parametrize(
    "rc, trained_too, message",
    [
        (0, False, r"exit 0 \(124: hung until killed\)"),
        (124, False, r"exit 124 \(124: hung until killed\)"),
        (1, True, r"processes trained on a world that is not devices x num_nodes"),
    ],
    ids=["exit-0", "hung", "trained-anyway"],
)
def test_lightning_azureml_mismatch_fails_on_each_defect(rc, trained_too, message):
    fix = "".join(
        f"FAIL rank={r} reason=MPI started 2 process(es), Trainer wants devices x num_nodes = 4: set "
        "process_count_per_node=2, or run per node with NODE_RANK set\n"
        for r in range(2)
    )
    out = fix + ("".join(lightning(r, 2, "MPIEnvironment", per_node=1) for r in range(2)) if trained_too else "")
    with pytest.raises(AssertionError, match=message):
        lt.test_lightning_azureml_per_process_mismatch_stops_with_the_fix(launched(out, rc), lightning_image())
