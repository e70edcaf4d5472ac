"""Settings an image must never bake in: the ones that turn the fast fabric off, or pin it to one
cluster's device names, silently. An image that sets NCCL_IB_DISABLE=1, UCX_TLS=tcp or Open
MPI's pml=ob1 passes every check on a machine without InfiniBand and then runs every job over
TCP on the cluster; none of them prints an error. (At run time, on the node, the image's
`tb-doctor` check nccl.env judges the settings against the devices it sees; this judges the
image, wherever it runs.)

Sources: the image's ENV, what a login shell adds (/etc/profile.d), NCCL's config files, Open
MPI's MCA parameter files and UCX's config file. Each finding names the setting, its value
and where it comes from."""

from __future__ import annotations

import re
from dataclasses import dataclass

# UCX transports that ride InfiniBand/RoCE (verbs or mlx5 direct): a UCX_TLS without any of
# them keeps UCX off the fabric. "all"/"any" (Open MPI's pml_ucx_tls) let UCX choose.
UCX_IB_TRANSPORTS = re.compile(
    r"^(rc|rc_v|rc_x|rc_verbs|rc_mlx5|ud|ud_v|ud_x|ud_verbs|ud_mlx5|dc|dc_x|dc_mlx5|ib|all|any)$"
)
# libfabric providers without RDMA: forcing one keeps Intel MPI on TCP.
NON_RDMA_PROVIDERS = {"tcp", "sockets", "udp", "shm", "tcp;ofi_rxm", "udp;ofi_rxd", "net"}


@dataclass(frozen=True)
class Setting:
    name: str  # environment-variable form: NCCL_IB_DISABLE, UCX_TLS, OMPI_MCA_pml
    value: str
    source: str  # "image ENV", "login shell", or the file it was read from

    def __str__(self) -> str:
        return f"{self.name}={self.value} ({self.source})"


def parse_env(text: str, source: str) -> list[Setting]:
    """`env -0` output, or KEY=VALUE lines (docker inspect's Config.Env joined by newlines)."""
    sep = "\0" if "\0" in text else "\n"
    out = []
    for item in text.split(sep):
        if "=" in item:
            k, v = item.split("=", 1)
            out.append(Setting(k.strip(), v.strip(), source))
    return out


def parse_config_file(path: str, text: str) -> list[Setting]:
    """NCCL's nccl.conf and UCX's ucx.conf hold `NAME=value` lines with the variable's own
    name; Open MPI's *mca-params.conf holds `param = value`, the variable OMPI_MCA_param."""
    mca = path.endswith("mca-params.conf")
    ucx = path.endswith("ucx.conf")
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if ucx and line.startswith("["):
            break  # a [section] applies to matching hosts only; the defaults come before any
        m = re.match(r"^([A-Za-z_]\w*)\s*=\s*(.*?)\s*$", line)
        if m:
            name = f"OMPI_MCA_{m.group(1)}" if mca else m.group(1)
            out.append(Setting(name, m.group(2).strip('"'), path))
    return out


def _inclusion_list(value: str) -> list[str] | None:
    """A comma list that names what to use; None for an exclusion list (`^a,b`)."""
    return None if value.startswith("^") else [v.strip() for v in value.split(",") if v.strip()]


def _ucx_tls_without_fabric(value: str) -> bool:
    items = _inclusion_list(value)
    if items is None:  # ^list: the fabric is off only if the list excludes every IB transport family
        excluded = {v.strip() for v in value[1:].split(",")}
        return bool({"rc", "ud", "dc"} <= excluded or "ib" in excluded)
    return bool(items) and not any(UCX_IB_TRANSPORTS.match(t.split(":")[0]) for t in items)


def defects(settings: list[Setting]) -> list[str]:
    """One line per setting that switches the fabric off or pins it to named devices."""
    found = []

    def bad(s: Setting, why: str) -> None:
        found.append(f"{s}: {why}")

    for s in settings:
        n, v = s.name, s.value
        if n == "NCCL_IB_DISABLE" and v == "1":
            bad(s, "NCCL never uses InfiniBand/RoCE; every collective across nodes goes over TCP sockets")
        elif n == "NCCL_NET" and v.lower() == "socket":
            bad(s, "forces NCCL's socket transport")
        elif n in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") and v == "1":
            bad(s, "turns off NCCL's intra-node path (NVLink/PCIe peer-to-peer or shared memory)")
        elif n == "NCCL_NET_GDR_LEVEL" and v.upper() in ("0", "LOC"):
            bad(s, "turns off GPUDirect RDMA")
        elif n in (
            "NCCL_IB_HCA",
            "NCCL_SOCKET_IFNAME",
            "UCX_NET_DEVICES",
            "OMPI_MCA_pml_ucx_devices",
            "OMPI_MCA_btl_tcp_if_include",
        ) and _inclusion_list(v) not in (None, [], ["any"], ["all"]):
            bad(
                s,
                "pins one cluster's device/interface names into the image; elsewhere they match nothing "
                "(an exclusion list, `^docker0,lo`, is fine)",
            )
        elif n in ("UCX_TLS", "OMPI_MCA_pml_ucx_tls") and _ucx_tls_without_fabric(v):
            bad(s, "no InfiniBand/RoCE transport (rc, ud, dc) left: UCX runs over TCP or shared memory only")
        elif n == "OMPI_MCA_pml" and ("ucx" not in v.split(",") or v.startswith("^")):
            bad(s, "keeps Open MPI off UCX (its InfiniBand path; Open MPI 5 has no other)")
        elif n in ("FI_PROVIDER", "I_MPI_OFI_PROVIDER") and v.lower() in NON_RDMA_PROVIDERS:
            bad(s, "forces a libfabric provider without RDMA: Intel MPI runs over TCP")
    return found
