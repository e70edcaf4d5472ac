"""The tools the frameworks execute on a GPU node, executed here (static tier,
test_gpu_paths.py::test_runtime_tools_run). A library-loading check cannot see a missing or
broken ptxas: the image passes every CPU tier and fails at the job's first compiled kernel.

Usage: runtime_tools.py TOOL [TOOL ...]; prints one JSON object {tool: {"path", "version", "ok",
"detail"}}. Each tool is found the way its caller finds it, asked its version, and made to do a
trivial piece of its job where that needs no GPU:
- triton.ptxas: the ptxas Triton's wheel ships (triton/backends/nvidia/bin), which TorchInductor's
  kernels are assembled with; assembles a tiny PTX kernel for sm_80;
- xla.ptxas: the ptxas of NVIDIA's nvcc wheel (nvidia/cuda_nvcc/bin), which TensorFlow's XLA
  looks up beside its CUDA libraries; the same assembly;
- nvcc: the CUDA compiler on PATH (DeepSpeed's JIT ops, torch.utils.cpp_extension); compiles a
  tiny kernel to an object;
- ninja: the build tool torch.utils.cpp_extension drives; builds a one-rule build file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

PTX = """.version 7.0
.target sm_80
.address_size 64
.visible .entry tb_noop()
{
    ret;
}
"""
KERNEL = "__global__ void tb_axpy(float a, const float *x, float *y) { y[threadIdx.x] += a * x[threadIdx.x]; }\n"


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin or "")


def _run(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, capture_output=True, text=True, cwd=cwd, timeout=300)


def _ptxas(path: str, work: str) -> str:
    with open(os.path.join(work, "k.ptx"), "w") as f:
        f.write(PTX)
    r = _run([path, "-arch=sm_80", "k.ptx", "-o", "k.cubin"], work)
    assert r.returncode == 0, f"ptxas could not assemble a kernel: {(r.stderr or r.stdout).strip()[-400:]}"
    assert os.path.getsize(os.path.join(work, "k.cubin")) > 0, "ptxas wrote an empty cubin"
    return "assembled a kernel for sm_80"


def _nvcc(path: str, work: str) -> str:
    with open(os.path.join(work, "k.cu"), "w") as f:
        f.write(KERNEL)
    r = _run([path, "-c", "-arch=sm_80", "k.cu", "-o", "k.o"], work)
    assert r.returncode == 0, f"nvcc could not compile a kernel: {(r.stderr or r.stdout).strip()[-400:]}"
    return "compiled a kernel for sm_80"


def _ninja(path: str, work: str) -> str:
    with open(os.path.join(work, "build.ninja"), "w") as f:
        f.write("rule copy\n  command = cp $in $out\nbuild out.txt: copy in.txt\n")
    with open(os.path.join(work, "in.txt"), "w") as f:
        f.write("tb\n")
    r = _run([path], work)
    assert r.returncode == 0 and os.path.exists(os.path.join(work, "out.txt")), f"ninja failed: {r.stdout[-400:]}"
    return "built a one-rule build file"


def _locate(tool: str) -> str | None:
    if tool == "triton.ptxas":
        d = _package_dir("triton")
        return os.path.join(d, "backends", "nvidia", "bin", "ptxas") if d else None
    if tool == "xla.ptxas":
        d = _package_dir("nvidia.cuda_nvcc")
        return os.path.join(d, "bin", "ptxas") if d else None
    return shutil.which(tool)


VERSION_FLAG = {"ninja": "--version"}
DO = {"triton.ptxas": _ptxas, "xla.ptxas": _ptxas, "nvcc": _nvcc, "ninja": _ninja}


def check(tool: str) -> dict[str, object]:
    if tool not in DO:
        return {"ok": False, "detail": f"unknown tool {tool!r} (known: {', '.join(DO)})"}
    path = _locate(tool)
    if not path or not os.access(path, os.X_OK):
        return {
            "ok": False,
            "path": path,
            "detail": f"not found or not executable: {path or 'no such package or command'}",
        }
    try:
        v = _run([path, VERSION_FLAG.get(tool, "--version")], "/")
        version = (v.stdout or v.stderr).strip().splitlines()[-1] if (v.stdout or v.stderr).strip() else ""
        assert v.returncode == 0, f"{path} --version exited {v.returncode}: {(v.stderr or v.stdout).strip()[-300:]}"
        with tempfile.TemporaryDirectory() as work:
            detail = DO[tool](path, work)
    except (AssertionError, OSError, subprocess.SubprocessError) as e:
        return {"ok": False, "path": path, "detail": str(e)}
    return {"ok": True, "path": path, "version": version, "detail": detail}


def main(tools: list[str]) -> int:
    print(json.dumps({t: check(t) for t in tools}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
