"""The GPU-path checks judged on fake image answers, so their failures are shown on every unit
run: Horovod built without GPU operations or against another NCCL, CUDA objects missing a GPU
generation or PTX, and the GPU tier's Horovod and DeepSpeed probes reporting a wrong value or
too few ranks must each fail with what is wrong; the honest answers pass."""

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_gpu_paths as gp

ARCHS = ["8.0", "8.9", "9.0", "10.0"]


class FakeTarget:
    """An image whose probes answer ``answer`` (json_probe) and print ``stdout`` (sh)."""

    def __init__(self, frameworks, answer=None, stdout="", rc=0, gpus=1):
        self.name = "fake"
        self.python = "/opt/trainbase/venv/bin/python"
        self.components = {"nccl": {"version": "2.30.7"}}
        self.manifest = {
            "frameworks": frameworks,
            "cuda_compiler": {
                "nvcc": "13.2.86",
                "kept": True,
                "architectures": ARCHS,
                "cuobjdump": "/x/bin/cuobjdump",
                "home": "/x",
            },
        }
        self.caps = SimpleNamespace(gpu_count=gpus)
        self.mpi = SimpleNamespace(local=lambda n: f"mpirun -np {n}")
        self.answer, self.stdout, self.rc = answer, stdout, rc

    def json_probe(self, cmd, timeout=None):
        return self.answer

    def sh(self, cmd, timeout=None):
        return SimpleNamespace(rc=self.rc, stdout=self.stdout, stderr="")

    def need_mpi(self):
        return self.mpi


HVD = {"horovod": "0.28.1", "pytorch": "2.15.0"}
LINKED = ["/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"]


def test_horovod_without_gpu_operations_fails():
    t = FakeTarget(HVD, {"cuda": False, "nccl": 0, "lib": "mpi_lib_v2.so", "nccl_linked": []})
    with pytest.raises(
        AssertionError, match=r"Horovod was built without GPU operations \(cuda_built=False, nccl_built=0\)"
    ):
        gp.test_horovod_built_with_nccl_gpu_operations(t)


def test_horovod_built_against_another_nccl_fails():
    t = FakeTarget(HVD, {"cuda": True, "nccl": 22809, "lib": "mpi_lib_v2.so", "nccl_linked": LINKED})
    with pytest.raises(AssertionError, match=r"Horovod was built against NCCL 22809, the image's is 23007"):
        gp.test_horovod_built_with_nccl_gpu_operations(t)


def test_horovod_with_the_image_s_nccl_passes():
    gp.test_horovod_built_with_nccl_gpu_operations(
        FakeTarget(HVD, {"cuda": True, "nccl": 23007, "lib": "mpi_lib_v2.so", "nccl_linked": LINKED})
    )


def test_cuda_code_for_one_gpu_generation_fails_naming_what_it_lacks():
    t = FakeTarget(HVD, {"horovod/torch/mpi_lib_v2.so": {"sm": ["sm_90"], "ptx": []}})
    with pytest.raises(
        AssertionError, match=r"mpi_lib_v2\.so': 'lacks sm_100, sm_80, sm_89; no PTX for sm_100 \(has none\)'"
    ):
        gp.test_compiled_cuda_code_targets_every_declared_gpu(t)


def test_no_cuda_code_at_all_fails():
    with pytest.raises(AssertionError, match=r"no CUDA code found in the image's compiled framework objects"):
        gp.test_compiled_cuda_code_targets_every_declared_gpu(FakeTarget(HVD, {}))


def test_cuda_code_for_every_generation_passes():
    gp.test_compiled_cuda_code_targets_every_declared_gpu(
        FakeTarget(
            HVD, {"horovod/torch/mpi_lib_v2.so": {"sm": ["sm_100", "sm_80", "sm_89", "sm_90"], "ptx": ["sm_100"]}}
        )
    )


def rank(r, ok=True):
    return f"[{r}]<stdout>:" + json.dumps(
        {"probe": "horovod_gpu", "rank": r, "ok": ok, "allreduce_ok": ok, "allreduce_64MiB_ms": 1.0, "algbw_GBps": 60.0}
    )


def test_the_horovod_gpu_probe_fails_on_a_wrong_value_or_a_missing_rank():
    with pytest.raises(
        AssertionError,
        match=r"Horovod's GPU collectives gave wrong values or failed: \[\{'probe': 'horovod_gpu', 'rank': 1, 'ok': False",
    ):
        gp.test_horovod_nccl_allreduce_of_cuda_tensors(
            FakeTarget(HVD, stdout=f"{rank(0)}\n{rank(1, ok=False)}\n", rc=1, gpus=2)
        )
    with pytest.raises(AssertionError, match=r"1 of 2 ranks reported"):
        gp.test_horovod_nccl_allreduce_of_cuda_tensors(FakeTarget(HVD, stdout=f"{rank(0)}\n", gpus=2))
    gp.test_horovod_nccl_allreduce_of_cuda_tensors(FakeTarget(HVD, stdout=f"{rank(0)}\n{rank(1)}\n", gpus=2))


def test_the_deepspeed_gpu_probe_fails_when_fused_adam_disagrees_with_adamw():
    out = {
        "probe": "deepspeed_gpu",
        "ok": False,
        "fused_adam_ok": False,
        "fused_adam_vs_torch_adamw_max_err": 0.03,
        "engine_optimizer": "FusedAdam",
        "engine_steps_per_s": 50.0,
    }
    t = FakeTarget({"deepspeed": "0.19.8", "pytorch": "2.15.0"}, stdout=json.dumps(out) + "\n", rc=1)
    with pytest.raises(AssertionError, match=r"DeepSpeed's fused optimizers on the GPU: \{.*'fused_adam_ok': False"):
        gp.test_deepspeed_fused_adam_steps_on_the_gpu(t)


def test_tensorflow_that_registers_no_gpu_fails():
    """A TensorFlow image missing a CUDA library it loads registers no GPU and runs on the CPU."""
    t = FakeTarget(
        {"tensorflow": "2.21.0"},
        {
            "gpus": 0,
            "device": "/job:localhost/replica:0/task:0/device:CPU:0",
            "max_err": 0.0,
            "tflops": 0.4,
            "replicas": 1,
            "sum": 1.0,
        },
        gpus=8,
    )
    with pytest.raises(AssertionError, match=r"TensorFlow registered 0 GPU\(s\), the host has 8"):
        gp.test_tensorflow_registers_the_gpus_and_reduces_across_them(t)
    gp.test_tensorflow_registers_the_gpus_and_reduces_across_them(
        FakeTarget(
            {"tensorflow": "2.21.0"},
            {
                "gpus": 8,
                "device": "/job:localhost/replica:0/task:0/device:GPU:0",
                "max_err": 1e-4,
                "tflops": 50.0,
                "replicas": 8,
                "sum": 36.0,
            },
            gpus=8,
        )
    )


def test_a_cpu_adam_that_computes_another_update_fails():
    """A prebuilt cpu_adam that loads and steps, but drifts from torch's AdamW (an op built from
    a wrong source, or for another instruction set than it runs on)."""
    ds = {"deepspeed": "0.19.8", "pytorch": "2.9.1"}
    t = FakeTarget(ds, {"max_err": 0.0314})
    t.manifest["prebuilt_ops"] = {"deepspeed": ["cpu_adam", "fused_adam"]}
    with pytest.raises(AssertionError, match=r"DeepSpeedCPUAdam differs from torch's AdamW by 0\.0314 after 10 steps"):
        gp.test_deepspeed_cpu_adam_steps_match_torch_adamw(t)
    t.answer = {"max_err": 2.4e-7}
    gp.test_deepspeed_cpu_adam_steps_match_torch_adamw(t)


@pytest.mark.parametrize("linked", [[], ["not found"]], ids=["static", "not-found"])
def test_horovod_that_does_not_link_the_image_s_nccl_fails(linked):
    """Built with HOROVOD_NCCL_LINK=STATIC (no libnccl.so in ldd), or linked against a libnccl.so.2
    the image does not have (ldd: `libnccl.so.2 => not found`)."""
    t = FakeTarget(HVD, {"cuda": True, "nccl": 23007, "lib": "mpi_lib_v2.so", "nccl_linked": linked})
    with pytest.raises(AssertionError, match=r"Horovod's extension does not link the image's NCCL as a shared library"):
        gp.test_horovod_built_with_nccl_gpu_operations(t)


def test_a_gpu_probe_that_dies_before_it_prints_fails_naming_its_exit():
    """The probe process killed before its JSON line (a CUDA init that segfaults): no line to
    judge, and the check says so with the exit code, not with an IndexError or a count."""
    crashed = "Segmentation fault (core dumped)\n"
    with pytest.raises(
        AssertionError, match=r"the deepspeed_gpu probe printed nothing \(exit 139\): Segmentation fault"
    ):
        gp.test_deepspeed_fused_adam_steps_on_the_gpu(
            FakeTarget({"deepspeed": "0.19.8", "pytorch": "2.15.0"}, stdout=crashed, rc=139)
        )
    with pytest.raises(AssertionError, match=r"no rank reported \(exit 139\): Segmentation fault"):
        gp.test_horovod_nccl_allreduce_of_cuda_tensors(FakeTarget(HVD, stdout=crashed, rc=139, gpus=2))
