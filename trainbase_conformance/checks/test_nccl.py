"""NCCL: one library, loadable, the version the manifest names; gpu tier: an all-reduce.

Expectations come from the manifest's components.nccl."""

import json
import re
import shlex

import pytest

from trainbase_conformance.fixtures import PROBE_DIR

SONAME = "libnccl.so.2"


def _nccl(target) -> dict:
    if "nccl" not in target.cache:
        target.cache["nccl"] = target.json_probe(f"{target.python} {PROBE_DIR}/libversions.py nccl={SONAME}")["nccl"]
    return target.cache["nccl"]


@pytest.mark.static
@pytest.mark.evidence("load")
@pytest.mark.trainbase_contract("tb-doctor")
def test_nccl_loads(target):
    """libnccl.so.2 resolves through the dynamic linker and loads (no GPU needed): the image's
    own doctor check nccl.library, run in the image."""
    c = target.doctor_check("nccl.library")
    assert c["facts"].get("version"), c["summary"]


@pytest.mark.static
@pytest.mark.evidence("load")
@pytest.mark.trainbase_contract("tb-doctor")
def test_nccl_version(target):
    """ncclGetVersion of the library the linker loads equals the manifest's NCCL (doctor's
    nccl.library)."""
    c = target.doctor_check("nccl.library")
    assert c["status"] == "ok", c["summary"]
    assert c["facts"]["version"] == target.components["nccl"]["version"], c["facts"]


@pytest.mark.static
@pytest.mark.evidence("load")
@pytest.mark.trainbase_contract("tb-doctor")
def test_no_second_nccl_on_the_library_path(target):
    """No other libnccl.so.2 on LD_LIBRARY_PATH, in the linker cache or in site-packages could
    shadow the image's one (doctor's nccl.shadow)."""
    c = target.doctor_check("nccl.shadow")
    assert c["status"] == "ok", c["summary"]


@pytest.mark.static
@pytest.mark.evidence("load")
def test_one_nccl(target):
    """Exactly one libnccl.so.2 file in the image, and it is the one the linker loads."""
    target.require("nccl")  # an expectations file without 'nccl', on an image without NCCL: skipped
    r = target.sh("find / -xdev -path /proc -prune -o -name 'libnccl.so*' -type f -print")
    files = sorted(r.stdout.split())
    assert len(files) == 1, f"{len(files)} NCCL libraries in the image: {files}"
    info = _nccl(target)
    assert "error" not in info, f"{SONAME} does not load: {info['error']}"
    real = target.sh(f"readlink -f {info['path']}").stdout.strip()
    assert real == files[0], f"the linker loads {real}, the image's NCCL file is {files[0]}"


def nccl_version_code(version: str) -> int:
    """NCCL_VERSION_CODE as ncclGetVersion returns it: "2.21.5" -> 22105 (from NCCL 2.9 on)."""
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    return major * 10000 + minor * 100 + patch


@pytest.mark.static
@pytest.mark.evidence("load")
def test_nccl_version_from_the_library(target):
    """The libnccl.so.2 the dynamic linker gives the image's Python answers ncclGetVersion with
    the declared NCCL (ctypes, no GPU): the same claim tb-doctor checks, made without the
    image's own tools so that it holds for any image."""
    declared = target.components["nccl"]["version"]
    info = _nccl(target)
    assert "error" not in info, f"{SONAME} does not load: {info['error']}"
    assert info["version"] == nccl_version_code(declared), (
        f"{info['path']} reports NCCL {info['version']}, the image declares {declared} ({nccl_version_code(declared)})"
    )


# NCCL dlopens plugins by name from the library path at init: libnccl-net.so (or
# libnccl-net-<NCCL_NET_PLUGIN>.so), libnccl-tuner*.so, libnccl-profiler*.so. One that is there
# and does not load makes NCCL warn and fall back (net: its own IB/socket transport) or fail.
PLUGIN_FILES = r"libnccl-(net|tuner|profiler)[^/]*\.so[^/]*$"
PLUGIN_PROBE = """
import ctypes, json, sys
out = {}
for path in sys.argv[1:]:
    try:
        lib = ctypes.CDLL(path)
        syms = [s for s in ("ncclNetPlugin_v10", "ncclNetPlugin_v9", "ncclNetPlugin_v8", "ncclNetPlugin_v7",
                            "ncclNetPlugin_v6", "ncclTunerPlugin_v4", "ncclTunerPlugin_v3", "ncclTunerPlugin_v2",
                            "ncclProfiler_v4", "ncclProfiler_v3", "ncclProfiler_v2", "ncclProfiler_v1") if hasattr(lib, s)]
        out[path] = {"load": "loaded", "symbols": syms}
    except OSError as e:
        out[path] = {"load": f"error: {e}", "symbols": []}
print(json.dumps(out))
"""


@pytest.mark.static
@pytest.mark.evidence("load")
def test_nccl_plugins_declared_and_load(target):
    """Every NCCL plugin in the image (net, tuner, profiler: any file NCCL would dlopen by name)
    is one the manifest declares, and it loads and exports a plugin symbol; every plugin the
    manifest declares is there. No image may carry a stray plugin NCCL picks up by itself."""
    declared = [
        p if isinstance(p, str) else (p.get("path") or p.get("lib") or "")
        for p in target.components["nccl"].get("plugins") or []
    ]
    # the network plugin's own claim (test_nccl_net_plugin.py checks what it exports)
    # (only its files NCCL opens by name: aws-ofi-nccl's older libnccl-ofi-tuner.so is not one)
    declared += [
        f for f in (target.components.get("nccl_net_plugin") or {}).get("files") or [] if re.search(PLUGIN_FILES, f)
    ]
    r = target.sh(
        "find / -xdev \\( -path /proc -o -path /sys \\) -prune -o \\( -type f -o -type l \\) "
        "-name 'libnccl-*.so*' -print"
    )
    found = sorted(f for f in r.stdout.split() if re.search(PLUGIN_FILES, f))
    undeclared = [f for f in found if not any(f == d or f.endswith("/" + d) for d in declared)]
    absent = [d for d in declared if not any(f == d or f.endswith("/" + d) for f in found)]
    assert not undeclared, f"NCCL plugins in the image that the manifest does not declare: {undeclared}"
    assert not absent, f"NCCL plugins the manifest declares but the image lacks: {absent}"
    if not found:
        return
    info = target.json_probe(f"{target.python} -c {shlex.quote(PLUGIN_PROBE)} " + " ".join(found))
    bad = {f: v for f, v in info.items() if v["load"] != "loaded" or not v["symbols"]}
    assert not bad, f"NCCL plugins that do not load or export no plugin symbol: {bad}"


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_nccl_allreduce_gpu(target):
    """All local GPUs: a checked NCCL all-reduce (every element), algbw/busbw reported."""
    cudart = f"libcudart.so.{target.components['cuda']['version'].split('.')[0]}"
    r = target.sh(f"{target.python} {PROBE_DIR}/gpu_probe.py nccl {cudart} {SONAME}", timeout=300)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    assert r.rc == 0 and out.get("ok"), f"NCCL all-reduce failed: {out or r.stderr.strip()[-800:]}"
    assert out["gpus"] == target.caps.gpu_count, (
        f"the all-reduce ran on {out['gpus']} GPU(s), the host lists {target.caps.gpu_count}: every GPU must take part"
    )
    if out["gpus"] >= 2:  # one GPU moves no bytes over a bus: with two or more, some must
        assert out["busbw_GBps"] > 0, f"{out['gpus']} GPUs but no bus bandwidth: {out}"
    print(
        f"NCCL all-reduce on {out['gpus']} GPU(s), {out['bytes']} B: algbw {out['algbw_GBps']} GB/s, "
        f"busbw {out['busbw_GBps']} GB/s"
    )
