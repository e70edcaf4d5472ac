"""InfiniBand/RoCE from inside the container: the devices the host has (sysfs) against the
ones handed to the container (/dev/infiniband), port states, the verbs provider really
opening each device, and NCCL_* settings that contradict what is here."""

from __future__ import annotations

import ctypes

from .core import FAIL, OK, WARN, Node, Result, check
from .hardware import _read, absent, nccl_settings, rdma

DEVICE_FLAGS = (
    "pass the RDMA devices: `--device=/dev/infiniband --cap-add IPC_LOCK --ulimit memlock=-1` (Docker), "
    "an RDMA device-plugin resource (Kubernetes), or the cluster's container plugin (Slurm)"
)


@check("ib.devices", "the host's RDMA devices are handed to the container", "ib.dev", compare=("usable",))
def ib_devices(node: Node) -> Result:
    r = rdma(node)
    host, usable = sorted(r["devices"]), sorted(r["uverbs"])
    facts = {"host": host, "usable": usable, "dev_nodes": r["dev_nodes"]}
    if not host:
        if r["dev_nodes"]:
            return Result(
                "",
                WARN,
                f"/dev/infiniband has {', '.join(r['dev_nodes'])} but sysfs lists no RDMA device",
                hint="check the host's RDMA drivers (`ibv_devices` on the host)",
                facts=facts,
            )
        return absent(node, "ib", "no RDMA device on this node (sysfs lists none)", DEVICE_FLAGS, facts)
    missing = [d for d in host if d not in r["uverbs"]]
    if missing and not usable:
        return Result(
            "",
            FAIL,
            f"the host has {', '.join(host)} but no verbs device node is in this container "
            "(/dev/infiniband/uverbs*): NCCL and UCX fall back to TCP",
            hint=DEVICE_FLAGS,
            facts=facts,
        )
    if missing:
        return Result(
            "",
            WARN,
            f"{', '.join(missing)} of the host are not in this container (usable: {', '.join(usable)})",
            hint=DEVICE_FLAGS,
            facts=facts,
        )
    return Result(
        "", OK, "RDMA devices in the container: " + ", ".join(f"{d} ({r['uverbs'][d]})" for d in usable), facts=facts
    )


@check("ib.ports", "RDMA ports are ACTIVE", "ib.port")
def ib_ports(node: Node) -> Result:
    r = rdma(node)
    if not r["uverbs"]:
        return absent(node, "ib", "no RDMA device in this container, no port to check", DEVICE_FLAGS)
    active, down = [], []
    for dev in sorted(r["uverbs"]):
        for port, st in r["devices"][dev]["ports"].items():
            desc = f"{dev}/{port} {st['state'].split(':')[-1].strip()} ({st['link_layer']}, {st['rate']})"
            (active if st["state"].endswith("ACTIVE") else down).append(desc)
    facts = {"active": active, "not_active": down}
    hint = "check the cable, the switch and the subnet manager (`ibstat` on the host; RoCE: the netdev link)"
    if not active:
        return Result("", FAIL, "no ACTIVE port: " + "; ".join(down), hint=hint, facts=facts)
    if down:
        return Result("", WARN, f"{len(active)} ACTIVE, not active: " + "; ".join(down), hint=hint, facts=facts)
    return Result("", OK, "ACTIVE: " + "; ".join(active), facts=facts)


def verbs_devices(node: Node) -> dict[str, str]:
    """Open every device libibverbs lists: {name: "opened" | error}. Raises OSError when
    libibverbs itself does not load."""
    lib = node.load("libibverbs.so.1")
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    lib.ibv_open_device.restype = ctypes.c_void_p
    lib.ibv_open_device.argtypes = [ctypes.c_void_p]
    lib.ibv_close_device.argtypes = [ctypes.c_void_p]
    n = ctypes.c_int(0)
    devs = lib.ibv_get_device_list(ctypes.byref(n))
    out = {}
    for i in range(n.value if devs else 0):
        name = lib.ibv_get_device_name(devs[i]).decode()
        ctx = lib.ibv_open_device(devs[i])
        out[name] = "opened" if ctx else f"ibv_open_device failed (errno {ctypes.get_errno()})"
        if ctx:
            lib.ibv_close_device(ctx)
    if devs:
        lib.ibv_free_device_list(devs)
    return out


@check("ib.provider", "the verbs provider for each device loads and opens it", "ib.prov")
def ib_provider(node: Node) -> Result:
    r = rdma(node)
    if not r["uverbs"]:
        return absent(node, "ib", "no RDMA device in this container, no provider to load", DEVICE_FLAGS)
    try:
        opened = verbs_devices(node)
    except OSError as e:
        return Result(
            "",
            FAIL,
            f"libibverbs.so.1 does not load: {e}",
            hint="the image lacks rdma-core's libibverbs (or MOFED's): rebuild it with the ib block",
        )
    bad = []
    for dev in sorted(r["uverbs"]):
        prov = r["devices"][dev]["provider"]
        if dev not in opened:
            bad.append(
                f"{dev}: libibverbs lists no provider for it (kernel driver {r['devices'][dev]['driver'] or '?'}"
                f", provider lib{prov}): the provider is missing or does not match the host driver"
            )
        elif opened[dev] != "opened":
            bad.append(f"{dev}: {opened[dev]}")
    facts = {"opened": opened}
    if bad:
        return Result(
            "",
            FAIL,
            "; ".join(bad),
            hint="install the provider that matches the host's driver "
            "(rdma-core's ibverbs-providers, or MOFED/DOCA userspace matching the host's OFED)",
            facts=facts,
        )
    return Result(
        "",
        OK,
        "opened through their providers: "
        + ", ".join(f"{d} (lib{r['devices'][d]['provider']})" for d in sorted(r["uverbs"])),
        facts=facts,
    )


def _matches(spec: str, names: list[str]) -> list[str]:
    """NCCL's interface/HCA list syntax: prefixes, `=` exact, `^` excludes; `:port` ignored."""
    if not spec:
        return names
    exclude, exact = spec.startswith("^"), False
    spec = spec.lstrip("^")
    if spec.startswith("="):
        exact, spec = True, spec[1:]
    items = [s.split(":")[0] for s in spec.split(",") if s]
    hit = [n for n in names if any(n == i if exact else n.startswith(i) for i in items)]
    return [n for n in names if n not in hit] if exclude else hit


# Azure's HPC VM images (Azure/azhpc-images customizations/ndv4.sh, ndv5.sh) put the VM's PCI
# topology in /opt/microsoft and name it in the host's /etc/nccl.conf (NDv5:
# NCCL_TOPO_FILE=/opt/microsoft/ndv5/topo.xml): Hyper-V's virtual PCI hides which NUMA node and
# which HCA each GPU sits by, so NCCL without it pairs GPUs and HCAs across sockets. A container
# has the image's /etc/nccl.conf, not the host's.
AZURE_TOPO_DIR = "/opt/microsoft"


def azure_nd(node: Node) -> dict | None:
    """An Azure VM with NVIDIA GPUs and InfiniBand HCAs (ND-series), from what the node shows:
    the DMI vendor Hyper-V reports, the PCI devices, the RDMA devices; None elsewhere."""
    vendor = (node.read("/sys/class/dmi/id/sys_vendor") or "").strip()
    product = (node.read("/sys/class/dmi/id/product_name") or "").strip()
    if vendor != "Microsoft Corporation":
        return None
    gpus = []
    pci = node.path("/sys/bus/pci/devices")
    for d in sorted(pci.iterdir()) if pci.is_dir() else []:
        if _read(d / "vendor") == "0x10de" and _read(d / "class").startswith("0x03"):
            gpus.append(d.name)
    hcas = [n for n, d in rdma(node)["devices"].items() if d.get("provider") in ("mlx5", "mlx4")]
    if not gpus or not hcas:
        return None
    return {"vm": f"{vendor} {product}".strip(), "gpus": len(gpus), "hcas": hcas}


def azure_topology_warning(node: Node, s: dict[str, tuple[str, str]]) -> str | None:
    """On an Azure ND VM whose container reaches no NCCL topology file: what to mount and set."""
    nd = azure_nd(node)
    if nd is None or ("NCCL_TOPO_FILE" in s and node.path(s["NCCL_TOPO_FILE"][0]).is_file()):
        return None
    base = node.path(AZURE_TOPO_DIR)
    here = sorted(str(p.relative_to(node.path("/"))) for p in base.rglob("*topo*.xml")) if base.is_dir() else []
    if here:
        return (
            f"Azure ND VM ({nd['gpus']} GPUs, HCAs {', '.join(nd['hcas'])}): NCCL_TOPO_FILE is unset, though "
            f"/{here[0]} is here: set NCCL_TOPO_FILE=/{here[0]}"
        )
    return (
        f"Azure ND VM ({nd['gpus']} GPUs, HCAs {', '.join(nd['hcas'])}): no NCCL topology file reachable in this "
        f"container (the host's /etc/nccl.conf names it, the image's does not): mount {AZURE_TOPO_DIR} read-only and "
        f"name the file, `-v {AZURE_TOPO_DIR}:{AZURE_TOPO_DIR}:ro -e NCCL_TOPO_FILE={AZURE_TOPO_DIR}/ndv5/topo.xml` "
        f"(NDv4: {AZURE_TOPO_DIR}/ndv4-topo.xml); without it NCCL pairs GPUs and HCAs across NUMA nodes"
    )


@check("nccl.env", "NCCL settings agree with this node's devices", "nccl.env")
def nccl_env(node: Node) -> Result:
    s = nccl_settings(node)
    usable = sorted(rdma(node)["uverbs"])
    ifaces = (
        sorted(p.name for p in node.path("/sys/class/net").iterdir()) if node.path("/sys/class/net").is_dir() else []
    )
    fails, warns = [], []

    def said(k: str) -> str:
        return f"{k}={s[k][0]} (from {s[k][1]})"

    if s.get("NCCL_IB_DISABLE", ("0",))[0] == "1" and usable:
        fails.append(f"{said('NCCL_IB_DISABLE')} while {', '.join(usable)} are here: NCCL will use sockets")
    if "NCCL_NET" in s and s["NCCL_NET"][0].lower() == "socket" and usable:
        warns.append(f"{said('NCCL_NET')} forces sockets while {', '.join(usable)} are here")
    if "NCCL_SOCKET_IFNAME" in s and ifaces and not _matches(s["NCCL_SOCKET_IFNAME"][0], ifaces):
        fails.append(f"{said('NCCL_SOCKET_IFNAME')} matches no interface here ({', '.join(ifaces)}): bootstrap fails")
    if "NCCL_IB_HCA" in s and usable and not _matches(s["NCCL_IB_HCA"][0], usable):
        fails.append(f"{said('NCCL_IB_HCA')} matches none of {', '.join(usable)}: NCCL falls back to sockets")
    if "NCCL_TOPO_FILE" in s and not node.path(s["NCCL_TOPO_FILE"][0]).is_file():
        fails.append(f"{said('NCCL_TOPO_FILE')} does not exist in this container")
    for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        if s.get(k, ("0",))[0] == "1":
            warns.append(f"{said(k)} slows intra-node traffic")
    if s.get("NCCL_DEBUG", ("",))[0].upper() == "TRACE":
        warns.append(f"{said('NCCL_DEBUG')} slows every collective")
    topo = azure_topology_warning(node, s)
    if topo:
        warns.append(topo)
    facts = {k: v for k, (v, _) in s.items()}
    hint = "unset or correct the variable (an image ENV shows in `docker inspect`; /etc/nccl.conf is in the image)"
    if fails:
        return Result("", FAIL, "; ".join(fails + warns), hint=hint, facts=facts)
    if warns:
        return Result("", WARN, "; ".join(warns), hint=hint, facts=facts)
    return Result(
        "",
        OK,
        f"{len(s)} NCCL setting(s), none contradicts this node" + (f": {', '.join(sorted(s))}" if s else ""),
        facts=facts,
    )
