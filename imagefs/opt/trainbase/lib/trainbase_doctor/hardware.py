"""What this node has, asked once and kept on the Node for every check that needs it: the CUDA
driver and its GPUs (``cuda_driver``), the RDMA devices the host lists and the ones handed to
this container (``rdma``); and ``absent``, the verdict of a check whose hardware is not here.

The checks of the node, the fabric and the stack all share these, and only through this
module: it imports nothing of the doctor but ``core``, so no check module imports another."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

from .core import FAIL, SKIP, Node, Result

CUDA_ERRORS = {
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}
GPU_FLAGS = (
    "start the container with `--gpus all` (Docker), the nvidia runtime, or an nvidia.com/gpu resource (Kubernetes)"
)
# kernel driver -> the rdma-core/MOFED provider that serves it (for messages only)
PROVIDERS = {
    "mlx5_core": "mlx5",
    "mlx4_core": "mlx4",
    "rdma_rxe": "rxe",
    "efa": "efa",
    "irdma": "irdma",
    "bnxt_re": "bnxt_re",
    "qedr": "qedr",
    "hfi1": "hfi1",
    "siw": "siw",
    "vmw_pvrdma": "vmw_pvrdma",
}


def cuda_driver(node: Node) -> dict[str, Any]:
    """The driver as the CUDA driver API sees it, queried once per node: {"error"} or
    {"count", "devices", "driver_cuda", "driver_version"}."""
    if "cuda" in node.cache:
        return node.cache["cuda"]
    info: dict[str, Any] = {}
    try:
        cuda = node.load("libcuda.so.1")
    except OSError as e:
        info = {"error": "no-driver", "detail": f"libcuda.so.1 is not in this container ({e})"}
    else:
        rc = cuda.cuInit(0)
        v = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0:
            info["driver_cuda"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
        if rc != 0:
            info.update(
                error="no-device" if rc == 100 else "init",
                detail=f"cuInit returned {rc} ({CUDA_ERRORS.get(rc, 'see cuda.h')})",
            )
        else:
            n = ctypes.c_int(0)
            cuda.cuDeviceGetCount(ctypes.byref(n))
            devices = []
            for i in range(n.value):
                dev, name = ctypes.c_int(), ctypes.create_string_buffer(256)
                major, minor = ctypes.c_int(), ctypes.c_int()
                cuda.cuDeviceGet(ctypes.byref(dev), i)
                cuda.cuDeviceGetName(name, 256, dev)
                cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
                cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
                devices.append(f"{name.value.decode(errors='replace')} (cc {major.value}.{minor.value})")
            info.update(count=n.value, devices=devices)
    m = re.search(
        r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", node.read("/proc/driver/nvidia/version") or ""
    )
    info["driver_version"] = m.group(1) if m else None
    node.cache["cuda"] = info
    return info


def gpu_models(node: Node) -> list[str]:
    """The GPUs' names: the CUDA driver's; where CUDA does not initialise (a driver too old, a
    compat libcuda on the wrong GPU), the kernel module's (/proc/driver/nvidia/gpus/*/information),
    else nvidia-smi's."""
    names = [re.sub(r" \(cc [^)]*\)$", "", d) for d in cuda_driver(node).get("devices") or []]
    base = node.path("/proc/driver/nvidia/gpus")
    for f in sorted(base.glob("*/information")) if not names and base.is_dir() else []:
        m = re.search(r"^Model:\s*(.+?)\s*$", _read(f), re.M)
        if m:
            names.append(m.group(1))
    if not names:
        rc, out = node.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        names = [ln.strip() for ln in out.splitlines() if ln.strip()] if rc == 0 else []
    return names


def absent(node: Node, what: str, summary: str, hint: str, facts: dict | None = None) -> Result:
    """Hardware that is not here: a skip, unless the run said it must be (--expect)."""
    if what in node.expect:
        return Result("", FAIL, summary + f" (and --expect {what} says it must be)", hint=hint, facts=facts or {})
    return Result("", SKIP, f"skipped: {summary}", facts=facts or {})


def _read(p: Path, default: str = "") -> str:
    try:
        return p.read_text(errors="replace").strip()
    except OSError:
        return default


def rdma(node: Node) -> dict[str, Any]:
    """RDMA devices as the host's sysfs lists them, and which have a verbs node in this
    container: {"devices": {name: {...}}, "uverbs": {name: "/dev/infiniband/uverbsN"}}."""
    if "rdma" in node.cache:
        return node.cache["rdma"]
    devices: dict[str, dict[str, Any]] = {}
    base = node.path("/sys/class/infiniband")
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        ports = {}
        for p in sorted((d / "ports").iterdir()) if (d / "ports").is_dir() else []:
            ports[p.name] = {f: _read(p / f, "?") for f in ("state", "phys_state", "link_layer", "rate")}
        drv = d / "device" / "driver"
        driver = drv.resolve().name if drv.exists() else ""
        devices[d.name] = {
            "ports": ports,
            "driver": driver,
            "provider": PROVIDERS.get(driver, d.name.rstrip("0123456789_")),
        }
    uverbs = {}
    vbase = node.path("/sys/class/infiniband_verbs")
    for v in sorted(vbase.glob("uverbs*")) if vbase.is_dir() else []:
        ibdev = _read(v / "ibdev")
        if ibdev and node.path(f"/dev/infiniband/{v.name}").exists():
            uverbs[ibdev] = f"/dev/infiniband/{v.name}"
    dev_dir = node.path("/dev/infiniband")
    nodes_here = sorted(p.name for p in dev_dir.iterdir()) if dev_dir.is_dir() else []
    node.cache["rdma"] = {"devices": devices, "uverbs": uverbs, "dev_nodes": nodes_here}
    return node.cache["rdma"]


def fabric(node: Node) -> dict[str, Any]:
    """What the RDMA devices handed to this container are, by what NCCL needs for each: ``efa``
    (AWS EFA, the efa verbs provider: NCCL reaches it only through a net plugin, aws-ofi-nccl over
    libfabric), ``infiniband`` and ``roce`` (an Ethernet link layer: NCCL's own IB transport,
    with NCCL_IB_GID_INDEX where the default GID is not RoCE v2). {"devices": {name: kind},
    "kinds": [...]} over the devices with a verbs node here."""
    r = rdma(node)
    kinds: dict[str, str] = {}
    for name in r["uverbs"]:
        d = r["devices"].get(name, {})
        layers = {p.get("link_layer") for p in d.get("ports", {}).values()}
        if d.get("provider") == "efa":
            kinds[name] = "efa"
        elif "Ethernet" in layers:
            kinds[name] = "roce"
        else:
            kinds[name] = "infiniband"
    return {"devices": kinds, "kinds": sorted(set(kinds.values()))}


def nccl_settings(node: Node) -> dict[str, tuple[str, str]]:
    """NCCL_* from /etc/nccl.conf, then the environment (which wins, as in NCCL): {name: (value, source)}."""
    out: dict[str, tuple[str, str]] = {}
    for line in (node.read("/etc/nccl.conf") or "").splitlines():
        m = re.match(r"\s*(NCCL_\w+)\s*=\s*(.*?)\s*$", line)
        if m and not line.lstrip().startswith("#"):
            out[m.group(1)] = (m.group(2), "/etc/nccl.conf")
    out.update({k: (v, "environment") for k, v in node.env.items() if k.startswith("NCCL_")})
    return out
