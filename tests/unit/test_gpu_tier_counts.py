"""The GPU tier's checks judged on fake probe output, so their failures are shown without a
GPU: a container that sees fewer GPUs than the host lists, an all-reduce on fewer GPUs than the
host has, or two GPUs that move no bytes, must each fail; the honest case passes."""
import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_cuda, test_nccl


class FakeTarget:
    def __init__(self, gpu_count, probe_out, ib=False):
        self.caps = SimpleNamespace(gpu=gpu_count > 0, gpu_count=gpu_count, ib=ib,
                                    gpu_why=f"{gpu_count} GPU(s): GPU 0: NVIDIA H100 80GB HBM3")
        self.python = "python3"
        self.components = {"cuda": {"version": "12.8.1"}, "cudnn": {"version": "9.10.2"}}
        self.out = probe_out

    def sh(self, cmd, timeout=None):
        return SimpleNamespace(rc=0, stdout=json.dumps(self.out) + "\n", stderr="")


def devices(n):
    return {"probe": "devices", "driver": 13000, "runtime": 12080, "ok": n > 0,
            "devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "cc": "9.0"} for i in range(n)]}


def nccl(n, busbw):
    return {"probe": "nccl", "gpus": n, "bytes": 1 << 26, "wrong": 0, "ok": True, "algbw_GBps": 100.0,
            "busbw_GBps": busbw}


def test_the_device_query_passes_when_the_container_sees_every_gpu():
    test_cuda.test_cuda_device_query(FakeTarget(8, devices(8)))


def test_the_device_query_fails_when_the_container_sees_one_of_eight():
    with pytest.raises(AssertionError, match=r"the container sees 1 GPU\(s\), the host's nvidia-smi -L lists 8"):
        test_cuda.test_cuda_device_query(FakeTarget(8, devices(1)))


@pytest.mark.parametrize("host, ran, busbw, why", [
    (8, 1, 0.0, r"the all-reduce ran on 1 GPU\(s\), the host lists 8"),
    (2, 2, 0.0, r"2 GPUs but no bus bandwidth"),
])
def test_the_nccl_allreduce_fails_on_fewer_gpus_or_no_bus_traffic(host, ran, busbw, why):
    with pytest.raises(AssertionError, match=why):
        test_nccl.test_nccl_allreduce_gpu(FakeTarget(host, nccl(ran, busbw)))


@pytest.mark.parametrize("host, busbw", [(1, 0.0), (8, 350.0)])
def test_the_nccl_allreduce_passes_on_every_gpu(host, busbw):
    test_nccl.test_nccl_allreduce_gpu(FakeTarget(host, nccl(host, busbw)))
