"""NCCL: one library, loadable, the version the manifest names; gpu tier: an all-reduce.

Expectations come from the manifest's components.nccl."""
import json
import re

import pytest

from trainbase import conformance as tc

from .conftest import PROBE_DIR

SONAME = "libnccl.so.2"


def _nccl(target) -> dict:
    if "nccl" not in target.cache:
        target.cache["nccl"] = target.json_probe(f"{target.python} {PROBE_DIR}/libversions.py nccl={SONAME}")["nccl"]
    return target.cache["nccl"]


@pytest.mark.static
def test_nccl_loads(target):
    """libnccl.so.2 resolves through the dynamic linker and loads (no GPU needed)."""
    info = _nccl(target)
    assert "error" not in info, f"{SONAME} does not load: {info['error']}"


@pytest.mark.static
def test_nccl_version(target):
    """ncclGetVersion equals the manifest's NCCL (NCCL_VERSION_CODE)."""
    want = target.components["nccl"]["version"]
    info = _nccl(target)
    assert "error" not in info, f"{SONAME} does not load: {info['error']}"
    assert info["version"] == tc.nccl_version_code(want), \
        f"ncclGetVersion = {info['version']} ({info['path']}), manifest says {want} = {tc.nccl_version_code(want)}"


@pytest.mark.static
def test_one_nccl(target):
    """Exactly one libnccl.so.2 file in the image, and it is the one the linker loads."""
    r = target.sh("find / -xdev -path /proc -prune -o -name 'libnccl.so*' -type f -print")
    files = sorted(r.stdout.split())
    assert len(files) == 1, f"{len(files)} NCCL libraries in the image: {files}"
    info = _nccl(target)
    assert "error" not in info, f"{SONAME} does not load: {info['error']}"
    real = target.sh(f"readlink -f {info['path']}").stdout.strip()
    assert real == files[0], f"the linker loads {real}, the image's NCCL file is {files[0]}"


@pytest.mark.static
def test_nccl_plugins_resolve(target):
    """Every NCCL network plugin the manifest lists resolves all its libraries (ldd)."""
    plugins = target.components["nccl"].get("plugins") or []
    if not plugins:
        pytest.skip("n/a: the manifest lists no NCCL network plugin")
    problems = []
    for p in plugins:
        lib = p if isinstance(p, str) else (p.get("path") or p.get("lib") or "")
        if not lib.startswith("/"):
            lib = target.sh(f"ldconfig -p | sed -n 's/^\\s*{re.escape(lib)} .*=> //p' | head -1").stdout.strip()
        r = target.sh(f"ldd {lib}")
        missing = [ln.strip() for ln in r.stdout.splitlines() if "not found" in ln]
        if r.rc != 0 or missing:
            problems.append(f"{p}: {missing or r.stderr.strip()}")
    assert not problems, "; ".join(problems)


@pytest.mark.gpu
def test_nccl_allreduce_gpu(target):
    """All local GPUs: a checked NCCL all-reduce (every element), algbw/busbw reported."""
    cudart = f"libcudart.so.{target.components['cuda']['version'].split('.')[0]}"
    r = target.sh(f"{target.python} {PROBE_DIR}/gpu_probe.py nccl {cudart} {SONAME}", timeout=300)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    assert r.rc == 0 and out.get("ok"), f"NCCL all-reduce failed: {out or r.stderr.strip()[-800:]}"
    print(f"NCCL all-reduce on {out['gpus']} GPU(s), {out['bytes']} B: algbw {out['algbw_GBps']} GB/s, "
          f"busbw {out['busbw_GBps']} GB/s")
