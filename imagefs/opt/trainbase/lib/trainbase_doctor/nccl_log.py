"""NCCL's INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET,ENV) read for what it says about
GPUDirect RDMA: per HCA, per GPU/HCA pair, per NET channel, and the NCCL_* it took from the
environment. The formats are NCCL's own and changed across releases (2.12 to 2.30); each line's
format string and source file are quoted in tests/unit/fixtures/nccl_gdr/README.md, with a log
excerpt per release. Standard library only, no check here: checks_gpudirect gives the verdict."""

from __future__ import annotations

import re
from typing import Any

VERSION_RE = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)")
NETWORK_RE = re.compile(r"Using network (.+?)\s*$")
IB_USING_RE = re.compile(r"NET/IB : Using(.*?);\s*OOB")
IB_DEVICE_RE = re.compile(r"\[(\d+)\]([^:\s\]]+):(\d+)")
# graph/topo.cc (2.13+) and transport/net_ib.cc (2.12: with " (no module)")
HCA_RE = re.compile(r"NET/(.+?) : GPU Direct RDMA (Enabled|Disabled) for HCA (\d+) '([^']*)'(?: \((.+?)\))?")
# graph/paths.cc 2.12-2.28: "for GPU <busId hex, or rank from 2.26> / HCA <dev, or netId hex> (distance d > l)"
PAIR_RE = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for GPU (\w+) / HCA (\w+) \(distance (\d+) (?:<=|>) (\d+)\)")
# graph/paths.cc 2.29: "for GPU/sys-local (rank r) - NET/sys-local ([ using PXN via GPU/s-l, ]distance d > l...)"
PAIR29_RE = re.compile(
    r"GPU Direct RDMA (Enabled|Disabled) for GPU/\d+-\d+ \(rank (\d+)\) - NET/\d+-(\d+) "
    r"\(\s*(?:using PXN via GPU/\S+\s*)?distance (\d+) (?:<=|>) (\d+)"
)
DMABUF_RE = re.compile(r"DMA-BUF is available on GPU device (\d+)")
ENV_RE = re.compile(r"(NCCL_\w+) set by environment to (.+?)\s*$")
RANK_RE = re.compile(r"rank (\d+) nranks (\d+) cudaDev (\d+) nvmlDev (\d+) busId (\w+)")
CHANNEL_RE = re.compile(
    r"Channel (\d+)/(\d+) : (\d+)\[(\w+)\] -> (\d+)\[(\w+)\] \[(send|receive)\] via "
    r"NET/(.+?)/(\d+)(?:\((\d+)\))?(/GDRDMA)?(\(PCI\))?(/Shared)?\s*$"
)
PREFIX_RE = re.compile(r"^(\S+?):\d+:\d+ \[\d+\]")  # debug.cc: "%s:%d:%d [%d] NCCL INFO ", host:pid:tid [dev]
TOPO_ID_LOCAL = (1 << 56) - 1  # NCCL_TOPO_ID(system, local): the system id sits in the top byte


def path_type_names(version: tuple[int, int, int] | None) -> list[str] | None:
    """NCCL's topoPathTypeStr of that release (graph/topo.cc): what a 'distance N' means."""
    if version is None:
        return None
    if version < (2, 21, 0):
        return ["LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS", "DIS"]
    if version < (2, 26, 0):
        return ["LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS"]
    if version < (2, 27, 0):
        return ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS"]
    if version < (2, 27, 5):
        return ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "P2C", "PHB", "SYS", "NET", "DIS"]
    return ["LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS"]


def parse_nccl_gdr(log: str) -> dict[str, Any]:
    """What NCCL's INFO log says about GPUDirect RDMA: its version and network, each HCA's
    GDR support, each GPU/HCA pair's distance verdict, DMA-BUF per GPU, NCCL_* it read from
    the environment, and every NET channel (GDRDMA or not)."""
    out: dict[str, Any] = {
        "version": None,
        "network": None,
        "hcas": {},
        "hca_names": {},
        "pairs": [],
        "dmabuf_gpus": [],
        "env": {},
        "channels": [],
    }
    pair_lines: list[tuple[str, str, str, str, int, int]] = []
    ranks: dict[tuple[str, int], int] = {}  # (host, bus id) -> rank: bus ids repeat across nodes
    for raw in log.splitlines():
        line = raw.split("NCCL INFO", 1)[-1].strip()
        host = m.group(1) if (m := PREFIX_RE.match(raw)) else ""
        if m := VERSION_RE.search(line):
            out["version"] = out["version"] or tuple(int(g) for g in m.groups())
        elif m := NETWORK_RE.search(line):
            out["network"] = m.group(1)
        elif m := IB_USING_RE.search(line):
            out["hca_names"].update({int(i): name for i, name, _ in IB_DEVICE_RE.findall(m.group(1))})
        elif m := HCA_RE.search(line):
            out["hcas"][int(m.group(3))] = {
                "net": m.group(1),
                "name": m.group(4),
                "gdr": m.group(2) == "Enabled",
                "said": m.group(5) or "",
            }
        elif m := PAIR29_RE.search(line):
            out["pairs"].append(
                {
                    "rank": int(m.group(2)),
                    "hca": int(m.group(3)),
                    "gdr": m.group(1) == "Enabled",
                    "distance": int(m.group(4)),
                    "level": int(m.group(5)),
                    "line": line,
                }
            )
        elif m := PAIR_RE.search(line):
            pair_lines.append((host, m.group(1), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))))
        elif m := DMABUF_RE.search(line):
            out["dmabuf_gpus"].append(int(m.group(1)))
        elif m := ENV_RE.search(line):
            value = m.group(2)
            out["env"][m.group(1)] = value[:-1] if re.fullmatch(r"-?\d+\.", value) else value  # param.cc's "%lld."
        elif m := RANK_RE.search(line):
            ranks[(host, int(m.group(5), 16))] = int(m.group(1))
        elif m := CHANNEL_RE.search(line):
            send = m.group(7) == "send"
            out["channels"].append(
                {
                    "channel": int(m.group(1)),
                    "dir": m.group(7),
                    "rank": int(m.group(3) if send else m.group(5)),
                    "gpu": m.group(4) if send else m.group(6),
                    "net": m.group(8),
                    "hca": int(m.group(9)),
                    "gdr": bool(m.group(11)),
                    "line": line,
                }
            )
    for host, status, gpu, hca, distance, level in pair_lines:
        # GPU is a bus id (hex) up to 2.25, the rank from 2.26 on; HCA a dev number or a topology id (hex)
        by_rank = out["version"] is not None and out["version"] >= (2, 26, 0)
        rank = int(gpu) if by_rank and gpu.isdigit() else ranks.get((host, int(gpu, 16)))
        out["pairs"].append(
            {
                "rank": rank,
                "hca": int(hca, 16) & TOPO_ID_LOCAL,
                "gdr": status == "Enabled",
                "distance": distance,
                "level": level,
                "line": f"GPU Direct RDMA {status} for GPU {gpu} "
                f"/ HCA {hca} (distance {distance} {'<=' if status == 'Enabled' else '>'} {level})",
            }
        )
    return out
