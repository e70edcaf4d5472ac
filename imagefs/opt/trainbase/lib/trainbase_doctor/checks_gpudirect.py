"""GPUDirect RDMA: does NCCL move data between nodes straight between GPU memory and the HCA
(GDRDMA), or through a bounce buffer in host memory (a fraction of the bandwidth, and nothing
else says so)? Two checks, both "not applicable" without RDMA devices and GPUs (and, beside them,
``gpu.gdrcopy``: the node's gdrdrv module and /dev/gdrdrv for the image's libgdrapi):

- ``gpudirect.kernel``: what the kernel offers the HCA for GPU memory -- nvidia_peermem, or
  DMA-BUF -- and where each GPU sits against each HCA (PCIe root, NUMA node), from sysfs;
- ``gpudirect.nccl``: NCCL's own verdict, read from its INFO log (NCCL_DEBUG=INFO,
  NCCL_DEBUG_SUBSYS=INIT,NET,ENV): a real job's log given with ``--nccl-log FILE``, else a
  one-process communicator this check starts. It fails when a NET channel is not GDRDMA,
  naming why: no peermem and no DMA-BUF, an NCCL_* setting, or the GPU too far from the HCA.

The log lines are NCCL's own formats, which changed across releases; each is quoted with the
source line it comes from in tests/unit/fixtures/nccl_gdr/ (NVIDIA/nccl, tags 2.12 to 2.30); their
parser is ``nccl_log``."""

from __future__ import annotations

import gzip
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from .core import FAIL, OK, SKIP, WARN, Node, Result, check
from .hardware import GPU_FLAGS, absent, cuda_driver, nccl_settings, rdma
from .nccl_log import parse_nccl_gdr, path_type_names

# --- the kernel side -----------------------------------------------------------------------------
DMABUF_KERNEL = (5, 12)  # ib_umem_dmabuf / ibv_reg_dmabuf_mr: Linux 5.12
DMABUF_DRIVER = 515  # the first release of NVIDIA's open kernel modules, which alone export DMA-BUF
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124  # cuda.h; what NCCL's init.cc asks before using DMA-BUF


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2]) if text else ()


def _kernel_config(node: Node, release: str) -> bool | None:
    """CONFIG_DMA_SHARED_BUFFER of the running kernel, where a config is readable; None if not."""
    text = node.read(f"/boot/config-{release}") if release else None
    if text is None:
        try:
            text = gzip.decompress(node.path("/proc/config.gz").read_bytes()).decode(errors="replace")
        except OSError:
            return None
    return bool(re.search(r"^CONFIG_DMA_SHARED_BUFFER=y", text, re.M))


def _gpu_dmabuf(node: Node) -> bool | None:
    """The driver's own answer for GPU 0 (cuDeviceGetAttribute), None where libcuda does not load."""
    import ctypes

    info = cuda_driver(node)
    if info.get("error") or not info.get("count"):
        return None
    cuda = node.load("libcuda.so.1")
    flag = ctypes.c_int(0)
    if cuda.cuDeviceGetAttribute(ctypes.byref(flag), CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0) != 0:
        return None
    return bool(flag.value)


def kernel_gdr(node: Node) -> dict[str, Any]:
    """How the HCA may reach GPU memory on this node. The rule, as NCCL applies it:
    - peermem: /sys/module/nvidia_peermem (what NCCL 2.30's net_ib/gdr.cc tests, with the legacy
      nv_peer_mem's /sys/kernel/mm/memory_peers/nv_mem*/version), or its line in /proc/modules;
    - DMA-BUF: Linux >= 5.12 (RDMA's dma-buf import), CONFIG_DMA_SHARED_BUFFER where the kernel's
      config is readable, and the GPU side: the driver's CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
      (NCCL's init.cc asks exactly that) where libcuda loads, else NVIDIA's open kernel modules
      (/proc/driver/nvidia/version says "Open Kernel Module"; they exist from R515 on)."""
    if "gdr_kernel" in node.cache:
        return node.cache["gdr_kernel"]
    modules = node.read("/proc/modules") or ""
    peermem = node.path("/sys/module/nvidia_peermem").is_dir() or bool(re.search(r"^nvidia_peermem\s", modules, re.M))
    legacy = any(node.path(f"/sys/kernel/mm/memory_peers/{m}/version").exists() for m in ("nv_mem", "nv_mem_nc"))
    release = node.read("/proc/sys/kernel/osrelease") or ""
    driver_text = node.read("/proc/driver/nvidia/version") or ""
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+)\.", driver_text)
    driver = int(m.group(1)) if m else None
    open_modules = "Open Kernel Module" in driver_text
    config = _kernel_config(node, release)
    gpu_attr = _gpu_dmabuf(node)
    missing = []
    if _release(release) < DMABUF_KERNEL:
        missing.append(f"kernel {release or '?'} < {DMABUF_KERNEL[0]}.{DMABUF_KERNEL[1]}")
    if config is False:
        missing.append("the kernel is built without CONFIG_DMA_SHARED_BUFFER")
    if gpu_attr is False:
        missing.append("the driver says the GPU does not support DMA-BUF (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0)")
    elif gpu_attr is None and not open_modules:
        missing.append("the NVIDIA driver is not the open kernel modules" + (f" ({driver})" if driver else ""))
    elif gpu_attr is None and driver is not None and driver < DMABUF_DRIVER:
        missing.append(f"driver {driver} < {DMABUF_DRIVER}")
    facts = {
        "nvidia_peermem": peermem,
        "nv_peer_mem": legacy,
        "kernel": release or None,
        "driver": driver,
        "open_kernel_modules": open_modules,
        "config_dma_shared_buffer": config,
        "gpu_dmabuf_attribute": gpu_attr,
        "dmabuf": not missing,
        "dmabuf_missing": missing,
        "placement": placement(node),
    }
    node.cache["gdr_kernel"] = facts
    return facts


def _text(p: Path) -> str:
    try:
        return p.read_text(errors="replace").strip()
    except OSError:
        return ""


def _pci(node: Node, link: Path) -> tuple[str, list[str], int | None]:
    """A PCI device's address, its path from the root complex down, and its NUMA node."""
    try:
        real = link.resolve()
    except OSError:
        real = link
    parts = list(real.parts)
    chain = parts[parts.index("devices") + 1 :] if "devices" in parts else []
    chain = chain[next((i for i, p in enumerate(chain) if p.startswith("pci")), len(chain)) :]
    numa = _text(link / "numa_node")
    return real.name, chain, int(numa) if re.fullmatch(r"-?\d+", numa) and int(numa) >= 0 else None


def relation(a: tuple[str, list[str], int | None], b: tuple[str, list[str], int | None]) -> str:
    """nvidia-smi topo's words for two PCI devices: PXB (below one PCIe bridge/switch, GPUDirect's
    good case), PHB (through the CPU's host bridge), NODE (two root complexes, one NUMA node),
    SYS (across NUMA nodes), or ? where sysfs does not say."""
    ca, cb = a[1], b[1]
    if ca and cb and ca[0] == cb[0]:
        common = len(os.path.commonprefix([ca[:-1], cb[:-1]]))
        return "PXB" if common >= 2 else "PHB"
    if a[2] is not None and b[2] is not None:
        return "NODE" if a[2] == b[2] else "SYS"
    return "?"


def placement(node: Node) -> dict[str, Any]:
    """Each GPU (NVIDIA PCI display/3D controllers, in PCI order = NCCL's nvmlDev order) against
    each RDMA device: {"gpus": [{pci, numa}], "hcas": {name: {pci, numa}}, "pairs": {gpu pci: {hca: rel}}}."""
    gpus = []
    base = node.path("/sys/bus/pci/devices")
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        vendor, cls = _text(d / "vendor"), _text(d / "class")
        if vendor.lower() == "0x10de" and cls.startswith(("0x0302", "0x0300")):
            gpus.append(_pci(node, d))
    hcas = {
        name: _pci(node, node.path(f"/sys/class/infiniband/{name}/device")) for name in sorted(rdma(node)["devices"])
    }
    return {
        "gpus": [{"pci": g[0], "numa": g[2]} for g in gpus],
        "hcas": {n: {"pci": h[0] if h[1] else None, "numa": h[2]} for n, h in hcas.items()},
        "pairs": {g[0]: {n: relation(g, h) for n, h in hcas.items()} for g in gpus},
    }


# --- why a channel goes through host memory ------------------------------------------------------------
PEERMEM_FIX = (
    "load nvidia_peermem on the host (`modprobe nvidia-peermem`; GPU Operator: driver.rdma.enabled=true), "
    "or use DMA-BUF: Linux >= 5.12 with NVIDIA's open kernel modules"
)
ENV_FIX = "unset the NCCL_* setting (image ENV, the job spec, or /etc/nccl.conf)"
DISTANCE_FIX = (
    "run each rank on a GPU that shares a PCIe switch with its HCA (NCCL_IB_HCA per local rank, or the "
    "cluster's topology file in NCCL_TOPO_FILE); NCCL_NET_GDR_LEVEL=SYS only where PCIe peer-to-peer "
    "across the CPU is known to be fast"
)


def _setting(log: dict[str, Any], settings: dict[str, tuple[str, str]], name: str) -> tuple[str, str] | None:
    if name in log["env"]:
        return log["env"][name], "NCCL's log"
    return settings.get(name)


def staging_reasons(
    log: dict[str, Any],
    kernel: dict[str, Any],
    settings: dict[str, tuple[str, str]],
    hca: int,
    rank: int | None,
    gpu: str | None,
    direction: str,
) -> list[tuple[str, str]]:
    """Why NCCL keeps GPU ``gpu`` (rank ``rank``) and HCA ``hca`` off GPUDirect RDMA: [(kind, words)],
    kind one of module, env, distance, unknown. The log's own words first, then this node's."""
    why: list[tuple[str, str]] = []
    names = path_type_names(log["version"])
    hca_name = log["hcas"].get(hca, {}).get("name") or log["hca_names"].get(hca) or f"HCA {hca}"
    level = _setting(log, settings, "NCCL_NET_GDR_LEVEL")
    if level and level[0].upper() in ("0", "LOC"):
        why.append(("env", f"NCCL_NET_GDR_LEVEL={level[0]} (from {level[1]}) forbids GPUDirect RDMA"))
    read = _setting(log, settings, "NCCL_NET_GDR_READ")
    if direction == "send" and read and read[0] == "0":
        why.append(("env", f"NCCL_NET_GDR_READ=0 (from {read[1]}) keeps sends from reading GPU memory"))
    info = log["hcas"].get(hca)
    if info and not info["gdr"]:
        dmabuf_off = _setting(log, settings, "NCCL_DMABUF_ENABLE")
        if info["said"] == "no module" or not (kernel["nvidia_peermem"] or kernel["nv_peer_mem"]):
            no_dmabuf = (
                "NCCL_DMABUF_ENABLE=0 (from " + dmabuf_off[1] + ")"
                if dmabuf_off and dmabuf_off[0] == "0"
                else "no DMA-BUF (this node: " + "; ".join(kernel["dmabuf_missing"]) + ")"
                if kernel["dmabuf_missing"]
                else "no DMA-BUF on the GPU in NCCL's log"
                if log["version"] and not log["dmabuf_gpus"]
                else "DMA-BUF not taken"
            )
            why.append(
                (
                    "env" if no_dmabuf.startswith("NCCL_") else "module",
                    f"{hca_name}: no nvidia_peermem and {no_dmabuf}: NCCL says GPU Direct RDMA Disabled for the HCA",
                )
            )
        else:
            why.append(
                (
                    "module",
                    f"{hca_name}: NCCL says GPU Direct RDMA Disabled for the HCA although nvidia_peermem "
                    "is loaded (a peermem built before the HCA's driver does not register: rebuild it against the "
                    "host's OFED)",
                )
            )
    for p in log["pairs"]:
        if not p["gdr"] and p["hca"] == hca and (rank is None or p["rank"] in (None, rank)):
            d, lv = p["distance"], p["level"]
            if names and d < len(names) and lv < len(names):
                words = f"distance {names[d]} > {names[lv]}"
            else:
                words = f"distance {d} > {lv}"
            why.append(
                (
                    "distance",
                    f"GPU {gpu if gpu is not None else p['rank']} and {hca_name} are too far apart "
                    f"({words}, NCCL's log)",
                )
            )
    if not any(kind == "distance" for kind, _ in why):
        pairs = kernel["placement"]["pairs"]
        gpus = kernel["placement"]["gpus"]
        index = int(gpu) if gpu is not None and gpu.isdigit() and len(gpu) <= 2 else None
        if index is not None and index < len(gpus):
            rel = pairs.get(gpus[index]["pci"], {}).get(hca_name, "?")
            if rel in ("PHB", "NODE", "SYS") and not any(k == "module" for k, _ in why):
                why.append(
                    (
                        "distance",
                        f"GPU {index} ({gpus[index]['pci']}) and {hca_name} are {rel} apart on this "
                        "node's PCIe (sysfs): beyond NCCL's default GDR level (PXB)",
                    )
                )
    if not why and level:  # NCCL 2.30 logs no distance line: a level set below the GPU/HCA distance is silent
        why.append(
            (
                "env",
                f"NCCL_NET_GDR_LEVEL={level[0]} (from {level[1]}) allows GPUDirect RDMA only for GPUs "
                "that close to the HCA",
            )
        )
    return why or [("unknown", f"NCCL gives no reason in this log for {hca_name}")]


# --- the checks ----------------------------------------------------------------------------------------
def _applicable(node: Node) -> Result | None:
    """None where this node has both GPUs and RDMA devices, else the skip that says which is missing."""
    info = cuda_driver(node)
    if info.get("error") or not info.get("count"):
        return absent(node, "gpu", "not applicable: no GPU in this container, so no GPUDirect RDMA", GPU_FLAGS)
    if not rdma(node)["uverbs"]:
        return absent(
            node,
            "ib",
            "not applicable: no RDMA device in this container, so no GPUDirect RDMA",
            "pass the RDMA devices (`--device=/dev/infiniband`, an RDMA device-plugin resource)",
        )
    return None


@check("gpudirect.kernel", "the kernel lets the HCA reach GPU memory (nvidia_peermem or DMA-BUF)", "gdr.knl")
def gpudirect_kernel(node: Node) -> Result:
    skip = _applicable(node)
    if skip:
        return skip
    k = kernel_gdr(node)
    far = [g for g, hs in k["placement"]["pairs"].items() if hs and all(r in ("NODE", "SYS") for r in hs.values())]
    where = f"; GPU(s) with every HCA on another PCIe root or NUMA node: {', '.join(sorted(far))}" if far else ""
    if k["nvidia_peermem"] or k["nv_peer_mem"]:
        return Result(
            "",
            OK,
            ("nvidia_peermem loaded" if k["nvidia_peermem"] else "nv_peer_mem loaded")
            + (", DMA-BUF possible too" if k["dmabuf"] else "")
            + where,
            facts=k,
        )
    if k["dmabuf"]:
        return Result(
            "",
            OK,
            f"DMA-BUF: kernel {k['kernel']}, "
            + ("the driver says the GPU supports it" if k["gpu_dmabuf_attribute"] else "NVIDIA open kernel modules")
            + " (no nvidia_peermem, not needed)"
            + where,
            facts=k,
        )
    return Result(
        "",
        FAIL,
        "neither nvidia_peermem nor DMA-BUF: "
        + "; ".join(k["dmabuf_missing"])
        + ": NCCL stages every transfer between nodes through host memory"
        + where,
        hint=PEERMEM_FIX,
        facts=k,
    )


GDRDRV_FIX = (
    "load NVIDIA's gdrdrv kernel module on the node (GDRCopy's gdrdrv-dkms package, or the GPU Operator "
    "with gdrcopy enabled) and pass its device to the container (`--device=/dev/gdrdrv`; Kubernetes: "
    "the device plugin or a hostPath device); the image carries the library"
)


@check("gpu.gdrcopy", "GDRCopy can map GPU memory: the node's gdrdrv module and its device", "gdrcopy")
def gdrcopy(node: Node) -> Result:
    """GDRCopy's two halves: the image's libgdrapi (the manifest's components.gdrcopy) and the
    node's gdrdrv kernel module with its /dev/gdrdrv. Without the module UCX's gdr_copy transport
    is not opened and NCCL copies small GPU buffers with cudaMemcpy instead: jobs run, small
    messages to and from GPU memory are slower -- a warning, never a failure."""
    library = node.component("gdrcopy")
    module = node.path("/sys/module/gdrdrv").is_dir() or bool(
        re.search(r"^gdrdrv\s", node.read("/proc/modules") or "", re.M)
    )
    device = node.path("/dev/gdrdrv").exists()
    facts = {
        "library": (library or {}).get("version"),
        "gdrdrv_loaded": module,
        "device": device,
    }
    info = cuda_driver(node)
    if info.get("error") or not info.get("count"):
        return absent(
            node, "gpu", "not applicable: no GPU in this container, nothing for gdrdrv to map", GPU_FLAGS, facts
        )
    if not library:
        return Result("", SKIP, "skipped: this image carries no GDRCopy library", facts=facts)
    if device:
        return Result(
            "",
            OK,
            f"/dev/gdrdrv is here (gdrdrv {'loaded' if module else 'module not visible from here'}): UCX's "
            f"gdr_copy and NCCL map GPU memory through libgdrapi {library['version']}",
            facts=facts,
        )
    if module:
        return Result(
            "",
            WARN,
            "the node loads gdrdrv but /dev/gdrdrv is not in this container: GDRCopy is off",
            hint="pass the device: `--device=/dev/gdrdrv` (Kubernetes: the device plugin or a hostPath device)",
            facts=facts,
        )
    return Result(
        "",
        WARN,
        "the node does not load gdrdrv: UCX's gdr_copy transport is off and NCCL copies small GPU "
        "buffers with cudaMemcpy (slower small messages to and from GPU memory)",
        hint=GDRDRV_FIX,
        facts=facts,
    )


GDR_PROBE = r"""
import ctypes, sys
n = int(sys.argv[1])
lib = ctypes.CDLL("libnccl.so.2")
comms = (ctypes.c_void_p * n)()
rc = lib.ncclCommInitAll(comms, n, (ctypes.c_int * n)(*range(n)))
if rc == 0:
    for c in comms:
        lib.ncclCommDestroy(ctypes.c_void_p(c))
sys.exit(rc)
"""


def nccl_gdr_log(node: Node) -> tuple[str, str]:
    """(NCCL's INFO log, where it came from): the --nccl-log file, else a communicator over up to
    two of this node's GPUs in one process. With two, peer-to-peer and shared memory are off and
    connections are made at init, so the ranks connect through the HCA as ranks on two nodes do."""
    if node.nccl_log:
        return node.read(node.nccl_log) or "", node.nccl_log
    n = min(int(cuda_driver(node).get("count") or 1), 2)
    with tempfile.TemporaryDirectory(prefix="tb-doctor-") as tmp:
        env = dict(node.env, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,ENV", NCCL_DEBUG_FILE=f"{tmp}/nccl.%p.log")
        if n == 2:
            env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_NVLS_ENABLE="0", NCCL_RUNTIME_CONNECT="0")
        rc, out = node.run([sys.executable, "-c", GDR_PROBE, str(n)], timeout=120, env=env)
        log = "\n".join(p.read_text(errors="replace") for p in Path(tmp).glob("nccl.*.log")) or out
    return log, f"a one-process NCCL communicator over {n} GPU(s)" + ("" if rc == 0 else f" (exit {rc})")


@check("gpudirect.nccl", "NCCL moves data between nodes GPU-direct (GDRDMA), not through host memory", "gdr.nccl")
def gpudirect_nccl(node: Node) -> Result:
    if not node.nccl_log:
        skip = _applicable(node)
        if skip:
            return skip
    text, source = nccl_gdr_log(node)
    log = parse_nccl_gdr(text)
    kernel = kernel_gdr(node)
    settings = nccl_settings(node) if not node.nccl_log else {}
    net_channels = log["channels"]
    facts: dict[str, Any] = {
        "source": source,
        "nccl_version": ".".join(map(str, log["version"])) if log["version"] else None,
        "network": log["network"],
        "hcas": {str(k): v for k, v in log["hcas"].items()},
        "dmabuf_gpus": log["dmabuf_gpus"],
        "env": log["env"],
        "net_channels": len(net_channels),
        "gdr_channels": sum(1 for c in net_channels if c["gdr"]),
        "staged": [],
    }
    staged: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # (GPU -> HCA, reasons) -> directions
    kinds: set[str] = set()
    sockets = [c for c in net_channels if c["net"].lower() == "socket"]
    if (log["network"] or "").lower() == "socket" or sockets:
        return Result(
            "",
            FAIL,
            f"NCCL's network is sockets ({source}): every transfer between nodes goes through host memory over TCP",
            hint="see nccl.network and nccl.env (NCCL_IB_DISABLE, NCCL_NET, the RDMA devices handed in)",
            facts=facts,
        )
    for c in net_channels:
        if c["gdr"]:
            continue
        hca_name = log["hca_names"].get(c["hca"]) or log["hcas"].get(c["hca"], {}).get("name") or f"HCA {c['hca']}"
        reasons = staging_reasons(log, kernel, settings, c["hca"], c["rank"], c["gpu"], c["dir"])
        kinds.update(k for k, _ in reasons)
        dirs = staged.setdefault((f"GPU {c['gpu']} -> {hca_name}", tuple(w for _, w in reasons)), [])
        if c["dir"] not in dirs:
            dirs.append(c["dir"])
    if not net_channels:  # no channel through the network in this log: NCCL's per-HCA and per-pair verdicts
        for hca, info in sorted(log["hcas"].items()):
            if not info["gdr"]:
                reasons = staging_reasons(log, kernel, settings, hca, None, None, "receive")
                kinds.update(k for k, _ in reasons)
                staged.setdefault((f"{info['name']} (every GPU)", tuple(w for _, w in reasons)), [])
        for p in log["pairs"]:
            if not p["gdr"] and log["hcas"].get(p["hca"], {}).get("gdr", True):
                reasons = staging_reasons(log, kernel, settings, p["hca"], p["rank"], None, "receive")
                kinds.update(k for k, _ in reasons)
                staged.setdefault((f"rank {p['rank']} -> HCA {p['hca']}", tuple(w for _, w in reasons)), [])
    facts["staged"] = [
        what + (f" [{', '.join(dirs)}]" if dirs else "") + ": " + "; ".join(why) for (what, why), dirs in staged.items()
    ]
    if staged:
        n = len(net_channels) - facts["gdr_channels"]
        count = f"{n} of {len(net_channels)} NET channels" if net_channels else "NCCL's verdict per HCA"
        hint = (
            " / ".join(
                fix
                for kind, fix in (("module", PEERMEM_FIX), ("env", ENV_FIX), ("distance", DISTANCE_FIX))
                if kind in kinds
            )
            or "run the job with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV and read why"
        )
        return Result(
            "",
            FAIL,
            f"NCCL moves data between nodes through host memory ({count}, {source}): "
            + " | ".join(facts["staged"][:4]),
            hint=hint,
            facts=facts,
        )
    if net_channels:
        return Result(
            "",
            OK,
            f"every NET channel is GDRDMA ({len(net_channels)} channels over "
            f"{', '.join(sorted({c['net'] for c in net_channels}))}, {source})",
            facts=facts,
        )
    if log["hcas"]:
        return Result(
            "",
            OK,
            "NCCL enables GPU Direct RDMA for "
            + ", ".join(i["name"] for i in log["hcas"].values())
            + f" ({source}; no channel through the network in this log: "
            "run a job across nodes with --nccl-log to see every channel)",
            facts=facts,
        )
    return Result(
        "",
        WARN,
        f"NCCL's log says nothing about GPU Direct RDMA ({source})",
        facts=facts,
        hint="log with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV (NET carries the GDR lines)",
    )
