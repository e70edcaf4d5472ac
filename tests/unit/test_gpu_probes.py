"""The GPU probes' own comparisons and the GPU checks' headline asserts, without a GPU.

probes/gpu_probe.py runs as it is, its ctypes libraries (libcuda, libcudart, libnccl) replaced by
fakes that answer as the CUDA driver/runtime and NCCL do, through the same pointers; probes/
deepspeed_gpu.py runs as it is over a fake torch and DeepSpeed (a tensor of a few floats, AdamW's
formula). A kernel that writes wrong values, an all-reduce that gives a wrong sum and a FusedAdam
that computes another update must each make the probe say so and exit 1, and the check that runs
the probe must fail on that output; the healthy fakes pass end to end. TensorFlow's GPU check is
judged on its probe's JSON line: a matmul on the CPU, a matmul far from NumPy's, and a
MirroredStrategy sum that is wrong must each fail."""

import ctypes
import json
import math
import random
import runpy
import sys
import types
from array import array
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_cuda, test_nccl
from trainbase_conformance.checks import test_gpu_paths as gp

from .conftest import ROOT

GPU_PROBE = str(ROOT / "trainbase_conformance" / "probes" / "gpu_probe.py")
DEEPSPEED_PROBE = str(ROOT / "trainbase_conformance" / "probes" / "deepspeed_gpu.py")


def run_probe(monkeypatch, capsys, path, argv, libs=None, modules=None):
    """Run a probe as `python PATH ARGV...`: (exit code, its last stdout line as JSON, all stdout)."""
    if libs is not None:
        monkeypatch.setattr(ctypes, "CDLL", lambda name: libs[name])
    for name, mod in (modules or {}).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(sys, "argv", [path, *argv])
    capsys.readouterr()
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1]), out


# --------------------------------------------------------------------------- CUDA and NCCL through ctypes


def _set(ref, value):
    ref._obj.value = value
    return 0


class FakeDevice:
    """One process's view of ``n`` GPUs: libcuda's and libcudart's calls the probe makes. Device
    memory is a dict of bytearrays keyed by the pointer handed out."""

    def __init__(self, n=2, kernel=lambda i: 3 * i + 1):
        self.n, self.kernel, self.mem, self.next = n, kernel, {}, 0x1000

    # libcuda
    def cuInit(self, flags):
        return 0

    def cuDriverGetVersion(self, ref):
        return _set(ref, 13000)

    def cuDeviceGet(self, ref, i):
        return _set(ref, i)

    def cuDeviceGetName(self, buf, size, dev):
        buf.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def cuDeviceGetAttribute(self, ref, attr, dev):
        return _set(ref, {75: 9, 76: 0}[attr])

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        return _set(ref, 1)

    def cuCtxSetCurrent(self, ctx):
        return 0

    def cuModuleLoadData(self, ref, ptx):
        return _set(ref, 2)

    def cuModuleGetFunction(self, ref, mod, name):
        return _set(ref, 3)

    def cuMemAlloc_v2(self, ref, size):
        return self.cudaMalloc(ref, size)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
        out = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64)).contents.value
        n = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_uint32)).contents.value
        self.mem[out][: 4 * n] = array("I", (self.kernel(i) & 0xFFFFFFFF for i in range(n))).tobytes()
        return 0

    def cuCtxSynchronize(self):
        return 0

    def cuMemcpyDtoH_v2(self, host, dptr, size):
        ctypes.memmove(host, bytes(self.mem[dptr.value][: size.value]), size.value)
        return 0

    def cuMemFree_v2(self, dptr):
        return 0

    # libcudart
    def cudaRuntimeGetVersion(self, ref):
        return _set(ref, 12080)

    def cudaGetDeviceCount(self, ref):
        return _set(ref, self.n)

    def cudaSetDevice(self, i):
        return 0

    def cudaMalloc(self, ref, size):
        self.next += 0x1000
        self.mem[self.next] = bytearray(size.value)
        return _set(ref, self.next)

    def cudaMemcpy(self, dst, src, size, kind):
        if kind == 1:  # host to device
            self.mem[dst.value][: size.value] = bytes(src)[: size.value]
        else:  # device to host
            ctypes.memmove(dst, bytes(self.mem[src.value][: size.value]), size.value)
        return 0

    def cudaStreamCreate(self, ref):
        return _set(ref, 7)

    def cudaStreamSynchronize(self, stream):
        return 0


class FakeNccl:
    """NCCL's one-process communicators: ncclAllReduce (float32, sum) of every buffer of a group,
    applied at ncclGroupEnd. ``alone``: each communicator a world of its own (the sum is its own
    buffer), the defect the probe must catch."""

    def __init__(self, device, alone=False):
        self.device, self.alone, self.pending = device, alone, []

    def ncclCommInitAll(self, comms, n, devs):
        for i in range(n):
            comms[i] = 0x100 + i
        return 0

    def ncclGroupStart(self):
        self.pending = []
        return 0

    def ncclAllReduce(self, send, recv, count, dtype, op, comm, stream):
        assert (dtype, op) == (7, 0)
        self.pending.append((send.value, count.value))
        return 0

    def ncclGroupEnd(self):
        bufs = [self.device.mem[p] for p, _ in self.pending]
        first = [array("f", b[:4])[0] for b in bufs]
        # every buffer of the probe holds one value throughout: the sum of those values, everywhere
        for b, v in zip(bufs, first, strict=True):
            assert b == array("f", [v]).tobytes() * (len(b) // 4), "a fake NCCL reduces constant buffers only"
        total = sum(first)
        for b, v in zip(bufs, first, strict=True):
            b[:] = array("f", [v if self.alone else total]).tobytes() * (len(b) // 4)
        return 0

    def ncclCommDestroy(self, comm):
        return 0


def libs(device, nccl=None):
    return {"libcuda.so.1": device, "libcudart.so.12": device, "libnccl.so.2": nccl or FakeNccl(device)}


class ProbeTarget:
    """A GPU host of ``gpus`` GPUs whose image prints what the probe printed, with its exit code."""

    def __init__(self, gpus, code, out):
        self.caps = SimpleNamespace(gpu=True, gpu_count=gpus, ib=False, gpu_why=f"{gpus} GPU(s): GPU 0: NVIDIA H100")
        self.python = "python3"
        self.components = {"cuda": {"version": "12.8.1"}, "cudnn": {"version": "9.10.2"}}
        self.r = SimpleNamespace(rc=code, stdout=out, stderr="")

    def sh(self, cmd, timeout=None):
        return self.r


def test_the_nccl_probe_checks_every_element_of_the_sum(monkeypatch, capsys):
    dev = FakeDevice(n=2)
    code, out, text = run_probe(monkeypatch, capsys, GPU_PROBE, ["nccl", "libcudart.so.12", "libnccl.so.2"], libs(dev))
    assert code == 0 and out["ok"] and out["wrong"] == 0 and out["gpus"] == 2, out
    test_nccl.test_nccl_allreduce_gpu(ProbeTarget(2, code, text))


def test_an_all_reduce_that_gives_a_wrong_sum_fails_the_probe_and_the_check(monkeypatch, capsys):
    dev = FakeDevice(n=2)
    code, out, text = run_probe(
        monkeypatch,
        capsys,
        GPU_PROBE,
        ["nccl", "libcudart.so.12", "libnccl.so.2"],
        libs(dev, FakeNccl(dev, alone=True)),
    )
    assert code == 1 and out["ok"] is False and out["wrong"] == 2 * (32 << 20 >> 2), out
    with pytest.raises(
        AssertionError,
        match=r"NCCL all-reduce failed: \{'probe': 'nccl', 'gpus': 2, "
        r"'bytes': 33554432, 'wrong': 16777216, 'ok': False",
    ):
        test_nccl.test_nccl_allreduce_gpu(ProbeTarget(2, code, text))


def test_the_nccl_check_fails_on_a_probe_that_stopped_at_a_call():
    line = json.dumps({"probe": "nccl", "error": "ncclCommInitAll returned 2"})
    with pytest.raises(AssertionError, match=r"NCCL all-reduce failed: \{'probe': 'nccl', 'error': 'ncclCommInitAll"):
        test_nccl.test_nccl_allreduce_gpu(ProbeTarget(8, 1, line + "\n"))


def test_the_kernel_probe_checks_every_element(monkeypatch, capsys):
    code, out, text = run_probe(monkeypatch, capsys, GPU_PROBE, ["kernel", "libcudart.so.12"], libs(FakeDevice()))
    assert code == 0 and out == {"probe": "kernel", "elements": 1 << 20, "wrong": 0, "ok": True}
    test_cuda.test_cuda_kernel(ProbeTarget(1, code, text))


def test_a_kernel_that_writes_one_wrong_value_fails_the_probe_and_the_check(monkeypatch, capsys):
    dev = FakeDevice(kernel=lambda i: 0 if i == 777 else 3 * i + 1)
    code, out, text = run_probe(monkeypatch, capsys, GPU_PROBE, ["kernel", "libcudart.so.12"], libs(dev))
    assert code == 1 and out["wrong"] == 1 and out["ok"] is False, out
    with pytest.raises(
        AssertionError,
        match=r"kernel check failed: \{'probe': 'kernel', 'elements': 1048576, "
        r"'wrong': 1, 'ok': False\}",
    ):
        test_cuda.test_cuda_kernel(ProbeTarget(1, code, text))


def test_the_devices_probe_counts_the_gpus_the_check_compares(monkeypatch, capsys):
    code, out, text = run_probe(monkeypatch, capsys, GPU_PROBE, ["devices", "libcudart.so.12"], libs(FakeDevice(n=8)))
    assert code == 0 and out["ok"] and [d["cc"] for d in out["devices"]] == ["9.0"] * 8, out
    test_cuda.test_cuda_device_query(ProbeTarget(8, code, text))
    code, out, text = run_probe(monkeypatch, capsys, GPU_PROBE, ["devices", "libcudart.so.12"], libs(FakeDevice(n=0)))
    assert code == 1 and out["ok"] is False and out["devices"] == []


def test_a_device_query_that_sees_no_gpu_fails_the_check(monkeypatch, capsys):
    code, out, text = run_probe(monkeypatch, capsys, GPU_PROBE, ["devices", "libcudart.so.12"], libs(FakeDevice(n=0)))
    with pytest.raises(
        AssertionError,
        match=r"device query failed: \{'probe': 'devices', 'driver': 13000, "
        r"'runtime': 12080, 'devices': \[\], 'ok': False\}",
    ):
        test_cuda.test_cuda_device_query(ProbeTarget(0, code, text))


# --------------------------------------------------------------------------- TensorFlow's GPU check

TF = {"tensorflow": "2.21.0"}
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"


def tf_line(**change):
    return {"gpus": 8, "device": GPU0, "max_err": 1e-4, "tflops": 50.0, "replicas": 8, "sum": 36.0, **change}


@pytest.mark.parametrize(
    "change, why",
    [
        (
            {"device": "/job:localhost/replica:0/task:0/device:CPU:0"},
            r"the matmul ran on /job:localhost/replica:0/task:0/"
            r"device:CPU:0, not the GPU",
        ),
        ({"max_err": 0.37}, r"the GPU matmul differs from NumPy by 0\.37"),
        ({"sum": 8.0}, r"MirroredStrategy over 8 replicas summed 8\.0"),
        ({"replicas": 1, "sum": 1.0}, r"MirroredStrategy over 1 replicas summed 1\.0"),
    ],
)
def test_tensorflow_s_matmul_and_all_reduce_are_checked_by_value(change, why):
    from .test_gpu_path_checks import FakeTarget

    gp.test_tensorflow_registers_the_gpus_and_reduces_across_them(FakeTarget(TF, tf_line(), gpus=8))
    with pytest.raises(AssertionError, match=why):
        gp.test_tensorflow_registers_the_gpus_and_reduces_across_them(FakeTarget(TF, tf_line(**change), gpus=8))


# --------------------------------------------------------------------------- DeepSpeed's fused optimizers


class T:
    """A tensor of a few float32 values (the probe's shapes do not matter to its comparisons)."""

    def __init__(self, v):
        self.v, self.grad = [float(x) for x in v], None

    def detach(self):
        return self

    def clone(self):
        return T(self.v)

    def requires_grad_(self, flag=True):
        return self

    def __sub__(self, o):
        return T([a - b for a, b in zip(self.v, o.v, strict=True)])

    def abs(self):
        return T([abs(a) for a in self.v])

    def max(self):
        return T([max(self.v)])

    def __float__(self):
        return self.v[0]

    def float(self):
        return self

    def all(self):
        return all(self.v)


def fake_torch(seed_state):
    rng = random.Random(0)  # noqa: S311 - fake tensors' values, not a secret
    torch = types.ModuleType("torch")

    def randn(*shape, **kw):
        return T([rng.gauss(0, 1) for _ in range(4)])

    class AdamW:
        fused = False  # FusedAdam's kernel: the same update, or (``wrong``) one without weight decay

        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kw):
            self.params, self.lr, self.betas, self.eps, self.wd, self.t = params, lr, betas, eps, weight_decay, 0
            self.m = [[0.0] * len(p.v) for p in params]
            self.s = [[0.0] * len(p.v) for p in params]

        def step(self):
            self.t += 1
            b1, b2 = self.betas
            wd = 0.0 if (self.fused and seed_state.get("wrong")) else self.wd
            for p, m, s in zip(self.params, self.m, self.s, strict=True):
                for i, g in enumerate(p.grad.v):
                    m[i] = b1 * m[i] + (1 - b1) * g
                    s[i] = b2 * s[i] + (1 - b2) * g * g
                    mh, sh = m[i] / (1 - b1**self.t), s[i] / (1 - b2**self.t)
                    p.v[i] = p.v[i] * (1 - self.lr * wd) - self.lr * mh / (math.sqrt(sh) + self.eps)

    torch.manual_seed = lambda s: None
    torch.device = lambda name: name
    torch.randn, torch.randn_like = randn, lambda p: randn()
    torch.randint = lambda lo, hi, shape, **kw: T([rng.randrange(lo, hi) for _ in range(4)])
    torch.isfinite = lambda p: T([math.isfinite(x) for x in p.v])
    torch.bfloat16 = "bfloat16"
    torch.optim = SimpleNamespace(AdamW=AdamW)
    torch.cuda = SimpleNamespace(synchronize=lambda: None)
    layer = lambda *a: None  # noqa: E731
    torch.nn = SimpleNamespace(
        Sequential=lambda *m: SimpleNamespace(parameters=list),
        Linear=layer,
        GELU=layer,
        functional=SimpleNamespace(cross_entropy=lambda out, y: out),
    )
    return torch, AdamW


def fake_deepspeed(torch, AdamW, state):
    class FusedAdam(AdamW):
        fused = True

        def __init__(self, params, adam_w_mode=True, **kw):
            super().__init__(params, **kw)

    class FusedLamb:
        def __init__(self, params, lr=1e-3):
            self.params, self.lr = params, lr

        def step(self):
            for p in self.params:
                p.v = [x - self.lr * (1 if g > 0 else -1) for x, g in zip(p.v, p.grad.v, strict=True)]

    class Engine:
        device = "cuda:0"

        def __init__(self):
            self.steps = 0

        def __call__(self, x):
            return T([2.3 * 0.9**self.steps])

        def backward(self, loss):
            pass

        def step(self):
            self.steps += 1

    optimizer_class = type("AdamW" if state.get("fallback") else "FusedAdam", (), {})
    mods = {
        "deepspeed": types.ModuleType("deepspeed"),
        "deepspeed.git_version_info": SimpleNamespace(
            installed_ops={"fused_adam": not state.get("not_prebuilt"), "fused_lamb": True}
        ),
        "deepspeed.ops": types.ModuleType("deepspeed.ops"),
        "deepspeed.ops.adam": SimpleNamespace(FusedAdam=FusedAdam),
        "deepspeed.ops.lamb": SimpleNamespace(FusedLamb=FusedLamb),
    }
    mods["deepspeed"].init_distributed = lambda dist_backend: None
    mods["deepspeed"].initialize = lambda **kw: (Engine(), SimpleNamespace(optimizer=optimizer_class()), None, None)
    return mods


def run_deepspeed_probe(monkeypatch, capsys, **state):
    torch, AdamW = fake_torch(state)
    modules = {"torch": torch, **fake_deepspeed(torch, AdamW, state)}
    monkeypatch.delenv("PROBE_ALLOW_JIT", raising=False)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    return run_probe(monkeypatch, capsys, DEEPSPEED_PROBE, [], modules=modules)


def ds_target(code, text):
    from .test_gpu_path_checks import FakeTarget

    return FakeTarget({"deepspeed": "0.19.8", "pytorch": "2.15.0"}, stdout=text, rc=code)


def test_the_deepspeed_probe_passes_fused_adam_that_steps_as_adamw(monkeypatch, capsys):
    code, out, text = run_deepspeed_probe(monkeypatch, capsys)
    assert code == 0 and out["ok"] and out["fused_adam_vs_torch_adamw_max_err"] < 1e-9, out
    assert out["fused_lamb_ok"] and out["engine_ok"] and out["engine_optimizer"] == "FusedAdam", out
    gp.test_deepspeed_fused_adam_steps_on_the_gpu(ds_target(code, text))


@pytest.mark.parametrize("state, key", [({"wrong": True}, "fused_adam_ok"), ({"fallback": True}, "engine_ok")])
def test_a_fused_adam_that_differs_or_an_engine_without_it_fails_the_probe_and_the_check(
    monkeypatch, capsys, state, key
):
    code, out, text = run_deepspeed_probe(monkeypatch, capsys, **state)
    assert code == 1 and out["ok"] is False and out[key] is False, out
    with pytest.raises(AssertionError, match=rf"DeepSpeed's fused optimizers on the GPU: \{{.*'{key}': False"):
        gp.test_deepspeed_fused_adam_steps_on_the_gpu(ds_target(code, text))


def test_ops_that_are_not_prebuilt_stop_the_probe_before_any_jit_build(monkeypatch, capsys):
    code, out, text = run_deepspeed_probe(monkeypatch, capsys, not_prebuilt=True)
    assert code == 1 and out["prebuilt"] == {"fused_adam": False, "fused_lamb": True} and "JIT" in out["error"], out
