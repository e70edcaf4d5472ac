"""The GPU tier's checks judged on fake probe output, so their failures are shown without a
GPU: a container that sees fewer GPUs than the host lists, an all-reduce on fewer GPUs than the
host has, or two GPUs that move no bytes, must each fail; the honest case passes."""

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_cuda, test_nccl


class FakeTarget:
    def __init__(self, gpu_count, probe_out, ib=False):
        self.caps = SimpleNamespace(
            gpu=gpu_count > 0, gpu_count=gpu_count, ib=ib, gpu_why=f"{gpu_count} GPU(s): GPU 0: NVIDIA H100 80GB HBM3"
        )
        self.python = "python3"
        self.components = {"cuda": {"version": "12.8.1"}, "cudnn": {"version": "9.10.2"}}
        self.out = probe_out

    def sh(self, cmd, timeout=None):
        return SimpleNamespace(rc=0, stdout=json.dumps(self.out) + "\n", stderr="")


def devices(n):
    return {
        "probe": "devices",
        "driver": 13000,
        "runtime": 12080,
        "ok": n > 0,
        "devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "cc": "9.0"} for i in range(n)],
    }


def nccl(n, busbw):
    return {
        "probe": "nccl",
        "gpus": n,
        "bytes": 1 << 26,
        "wrong": 0,
        "ok": True,
        "algbw_GBps": 100.0,
        "busbw_GBps": busbw,
    }


def test_the_device_query_passes_when_the_container_sees_every_gpu():
    test_cuda.test_cuda_device_query(FakeTarget(8, devices(8)))


def test_the_device_query_fails_when_the_container_sees_one_of_eight():
    with pytest.raises(AssertionError, match=r"the container sees 1 GPU\(s\), the host's nvidia-smi -L lists 8"):
        test_cuda.test_cuda_device_query(FakeTarget(8, devices(1)))


@pytest.mark.parametrize(
    "host, ran, busbw, why",
    [
        (8, 1, 0.0, r"the all-reduce ran on 1 GPU\(s\), the host lists 8"),
        (2, 2, 0.0, r"2 GPUs but no bus bandwidth"),
    ],
)
def test_the_nccl_allreduce_fails_on_fewer_gpus_or_no_bus_traffic(host, ran, busbw, why):
    with pytest.raises(AssertionError, match=why):
        test_nccl.test_nccl_allreduce_gpu(FakeTarget(host, nccl(ran, busbw)))


@pytest.mark.parametrize("host, busbw", [(1, 0.0), (8, 350.0)])
def test_the_nccl_allreduce_passes_on_every_gpu(host, busbw):
    test_nccl.test_nccl_allreduce_gpu(FakeTarget(host, nccl(host, busbw)))


def test_the_kernel_check_fails_when_the_kernel_writes_wrong_values():
    wrong = {"probe": "kernel", "ok": False, "n": 1 << 20, "wrong": 4096, "first_wrong": 262144}
    with pytest.raises(AssertionError, match=r"kernel check failed: \{'probe': 'kernel', 'ok': False, .*'wrong': 4096"):
        test_cuda.test_cuda_kernel(FakeTarget(1, wrong))
    test_cuda.test_cuda_kernel(FakeTarget(1, {"probe": "kernel", "ok": True, "n": 1 << 20, "wrong": 0}))


class FakeFrameworkTarget(FakeTarget):
    """A PyTorch image on a host of ``gpu_count`` GPUs whose torch sees ``seen`` and whose
    torchrun prints ``ok`` OK lines."""

    def __init__(self, gpu_count, seen, ok):
        super().__init__(gpu_count, {})
        self.manifest = {"frameworks": {"pytorch": "2.9.1"}}
        self.components["python"] = {"prefix": "/opt/trainbase/venv"}
        self.container = SimpleNamespace(exec=lambda *a, **k: None, put=lambda *a, **k: None)
        self.seen, self.ok = seen, ok

    def sh(self, cmd, timeout=None):
        if "device_count" in cmd:
            return SimpleNamespace(rc=0, stdout=f"{self.seen}\n", stderr="")
        lines = "".join(f"OK rank={i} world={self.seen} backend=nccl allreduce=1\n" for i in range(self.ok))
        return SimpleNamespace(rc=0, stdout=lines, stderr="")


def test_the_ddp_all_reduce_fails_when_torch_sees_fewer_gpus_than_the_host():
    """An image that pins CUDA_VISIBLE_DEVICES=0 on an 8-GPU runner: torch sees 1, and a check
    that took torch's count for the world ran (and passed) on 1 of 8."""
    from trainbase_conformance.checks import test_frameworks

    with pytest.raises(AssertionError, match=r"torch sees 1 GPU\(s\) in the container, the host lists 8"):
        test_frameworks.test_pytorch_nccl_allreduce_on_all_local_gpus(FakeFrameworkTarget(8, 1, 1))
    with pytest.raises(AssertionError, match=r"1 of 2 ranks reported OK"):
        test_frameworks.test_pytorch_nccl_allreduce_on_all_local_gpus(FakeFrameworkTarget(2, 2, 1))
    test_frameworks.test_pytorch_nccl_allreduce_on_all_local_gpus(FakeFrameworkTarget(2, 2, 2))
