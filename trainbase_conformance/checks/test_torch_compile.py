"""torch.compile: inductor turns a model into generated code and builds it with the image's own
tool chain -- C++ and the C compiler on the CPU, Triton (and its launcher, built with the C
compiler) on the GPU. A PyTorch image missing either compiles nothing, and the user finds out
at the first compiled step."""

from __future__ import annotations

import pytest

from trainbase_conformance.checks.test_frameworks import need, py_json
from trainbase_conformance.checks.test_gpu_paths import one_process_probe
from trainbase_conformance.emulation import emulated_cpus


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_torch_compile_runs_on_cpu(target):
    """torch.compile's inductor generates C++ for the CPU and builds it with the image's C
    compiler: a compiled function must give the eager result. An image without `cc`/`g++`, or
    whose Python headers are missing, fails here (and a user's first compiled step with it).
    Inductor writes its kernels for the CPU's vector ISA (AVX2/AVX-512; NEON or SVE at the CPU's
    vector length), so an emulated image compiles once per CPU its users have
    (emulation.emulated_cpus: on arm64 Grace's SVE2 at 128 bits and Graviton3's SVE at 256)."""
    need(target, "pytorch")
    code = """
        import os, shutil, time
        cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
        if not cxx:   # say so before inductor fails deep inside a compile
            print(json.dumps({"cxx": None}))
            raise SystemExit(0)
        import torch
        from torch._inductor.cpu_vec_isa import pick_vec_isa
        torch.manual_seed(0)
        def f(x, w):
            return torch.nn.functional.gelu(x @ w).sum(dim=1) * 3 + 1
        x, w = torch.randn(64, 32), torch.randn(32, 16)
        t = time.monotonic()
        got = torch.compile(f, backend="inductor", fullgraph=True)(x, w)
        seconds = time.monotonic() - t
        want = f(x, w)
        isa = pick_vec_isa()
        print(json.dumps({"close": bool(torch.allclose(got, want, rtol=1e-4, atol=1e-4)),
                          "max_err": float((got - want).abs().max()), "seconds": round(seconds, 1),
                          "cxx": cxx, "isa": f"{type(isa).__name__}({isa.bit_width()} bits)"}))
    """
    for cpu, model in emulated_cpus(target.inspect) or (("this host's CPU", None),):
        # qemu reads QEMU_CPU from the environment of each program it starts. Each CPU gets an
        # inductor cache of its own: the first CPU's cached graph (its kernels built for 128-bit
        # vectors) would otherwise be loaded on the second and crash, and nothing would compile.
        env = {"TORCHINDUCTOR_CACHE_DIR": f"/tmp/tbconf-inductor-{model or 'host'}"}
        info = py_json(target, code, timeout=600, env=env | ({"QEMU_CPU": model} if model else {}))
        assert info["cxx"], (
            "no C++ compiler on PATH for inductor (g++, c++ or $CXX): torch.compile cannot build its kernels"
        )
        assert info["close"], f"torch.compile's result on {cpu} differs from eager by {info['max_err']}: {info}"
        print(
            f"torch.compile (inductor, CPU) on {cpu}, {info['isa']}: compiled and ran in {info['seconds']} s, "
            f"max error {info['max_err']:.2e}"
        )


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_torch_compile_step_on_the_gpu(target):
    """torch.compile on CUDA: inductor generates Triton kernels and builds Triton's launcher
    with the image's C compiler; a compiled training step (loss and gradients) must match eager
    (trainbase_conformance/probes/torch_compile_gpu.py)."""
    need(target, "pytorch")
    out = one_process_probe(target, "torch_compile_gpu", "torch.compile on the GPU")
    print(f"torch.compile on the GPU: first step {out['first_step_s']} s (compile), then {out['steps_per_s']} steps/s")
