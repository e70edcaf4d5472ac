"""Multi-node mode: every rank of an MPI launch runs its checks, rank 0 gathers them and prints
one node x check table that points at the odd node out (a missing device or mount, another
driver, another image), then optionally times a value-checked all-reduce between the nodes.

The gathering uses the image's own MPI through mpi4py (every trainbase image has it, linked to
its MPI); the aggregation is pure and unit-tested without MPI."""
from __future__ import annotations

import json
import socket
import time
from typing import Any

from .core import CHECKS, FAIL, OK, SKIP, STATUSES, WARN

WORST = {FAIL: 3, WARN: 2, OK: 1, SKIP: 0}


def _ranges(ranks: list[int]) -> str:
    ranks, out = sorted(ranks), []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def aggregate(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-rank reports -> nodes (worst status per check over the node's ranks, facts of its
    lowest rank) and the differences between nodes, each naming the nodes that differ."""
    by_host: dict[str, list[dict]] = {}
    for r in sorted(reports, key=lambda r: r["node"].get("rank") or 0):
        by_host.setdefault(r["node"]["hostname"], []).append(r)
    nodes = []
    for host, rs in by_host.items():
        status: dict[str, str] = {}
        first: dict[str, dict] = {}
        for r in rs:
            for c in r["checks"]:
                if c["id"] not in status or WORST[c["status"]] > WORST[status[c["id"]]]:
                    status[c["id"]] = c["status"]
                first.setdefault(c["id"], c)
        nodes.append({"hostname": host, "ranks": [r["node"].get("rank") for r in rs], "status": status,
                      "checks": first,
                      "failures": [{"rank": r["node"].get("rank"), "id": c["id"], "summary": c["summary"],
                                    "hint": c["hint"]} for r in rs for c in r["checks"] if c["status"] == FAIL]})
    return {"nodes": nodes, "differences": differences(nodes)}


def differences(nodes: list[dict]) -> list[dict[str, Any]]:
    """Facts a check declares comparable that are not the same on every node, and checks that
    fail on some nodes only. A list fact (mounts, devices) names the nodes lacking an item;
    a scalar names the nodes outside the largest group (all of them on a tie)."""
    out: list[dict[str, Any]] = []
    if len(nodes) < 2:
        return out
    hosts = [n["hostname"] for n in nodes]
    for cid, meta in CHECKS.items():
        for key in meta.compare:
            values = {n["hostname"]: n["checks"][cid]["facts"].get(key) for n in nodes if cid in n["checks"]}
            if len(values) < 2 or len({json.dumps(v, sort_keys=True) for v in values.values()}) == 1:
                continue
            if all(isinstance(v, list) for v in values.values()):
                for item in sorted({i for v in values.values() for i in v}, key=str):
                    lacking = [h for h, v in values.items() if item not in v]
                    if lacking:
                        having = [h for h in values if h not in lacking]
                        out.append({"check": cid, "fact": key, "nodes": lacking, "summary":
                                    f"{cid}: {key} {item} missing on {', '.join(lacking)} (present on "
                                    f"{', '.join(having)})"})
                continue
            groups: dict[str, list[str]] = {}
            for h, v in values.items():
                groups.setdefault(json.dumps(v, sort_keys=True), []).append(h)
            ordered = sorted(groups.values(), key=len, reverse=True)
            majority = ordered[0] if len(ordered[0]) > len(ordered[1]) else []
            odd = [h for h in values if h not in majority]
            said = ", ".join(f"{h}={values[h]}" for h in odd)
            out.append({"check": cid, "fact": key, "nodes": odd, "summary":
                        f"{cid}: {key} differs: {said}" + (f" (the other {len(majority)} node(s): "
                                                           f"{values[majority[0]]})" if majority else "")})
    for cid in CHECKS:
        failing = [n["hostname"] for n in nodes if n["status"].get(cid) == FAIL]
        if failing and len(failing) < len(hosts):
            out.append({"check": cid, "fact": "status", "nodes": failing,
                        "summary": f"{cid} fails on {', '.join(failing)} only"})
    return out


def render(agg: dict[str, Any], world: int, collective: dict | None) -> str:
    ids = [c for c in CHECKS if any(c in n["status"] for n in agg["nodes"])]
    heads = ["node", "ranks"] + [CHECKS[c].label for c in ids]
    rows = [[n["hostname"], _ranges([r for r in n["ranks"] if r is not None])] +
            [n["status"].get(c, "-").upper() if n["status"].get(c) in (WARN, FAIL) else n["status"].get(c, "-")
             for c in ids] for n in agg["nodes"]]
    widths = [max(len(str(x)) for x in col) for col in zip(heads, *rows)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    lines = [f"tb-doctor: {len(agg['nodes'])} node(s), {world} rank(s)", fmt(heads)] + [fmt(r) for r in rows]
    if agg["differences"]:
        lines.append("odd one out:")
        lines += [f"  - {d['summary']}" for d in agg["differences"]]
    fails = [(n["hostname"], f) for n in agg["nodes"] for f in n["failures"]]
    if fails:
        lines.append("failures:")
        seen = set()
        for host, f in fails:
            if (host, f["id"], f["summary"]) not in seen:
                seen.add((host, f["id"], f["summary"]))
                lines.append(f"  - {host} rank {f['rank']}: {f['id']}: {f['summary']}\n      fix: {f['hint']}")
    if collective:
        lines.append(describe_collective(collective))
    return "\n".join(lines)


def describe_collective(c: dict) -> str:
    if not c["ok"]:
        return f"all-reduce ({c['backend']}, {c['ranks']} ranks): FAILED: {c['error']}"
    return (f"all-reduce ({c['backend']}, {c['ranks']} ranks, {c['bytes'] >> 20} MiB): values correct, "
            f"{c['seconds'] * 1e3:.2f} ms, algbw {c['algbw_GBps']:.2f} GB/s, busbw {c['busbw_GBps']:.2f} GB/s")


def _bandwidth(nbytes: int, seconds: float, ranks: int) -> dict[str, float]:
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"algbw_GBps": round(algbw, 3), "busbw_GBps": round(algbw * 2 * (ranks - 1) / ranks, 3)}


def mpi_allreduce(comm, nbytes: int, iters: int) -> tuple[bool, float]:
    """Sum of (rank + 1) over doubles through the image's MPI: every element checked."""
    from array import array

    from mpi4py import MPI

    n, size = nbytes // 8, comm.Get_size()
    send, recv = array("d", [float(comm.Get_rank() + 1)]) * n, array("d", [0.0]) * n
    comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM)
    ok = recv.count(size * (size + 1) / 2) == n
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM)
    return ok, (time.perf_counter() - t0) / iters


def torch_allreduce(comm, backend: str, nbytes: int, iters: int) -> tuple[bool, float]:
    """torch.distributed all-reduce (nccl on GPUs, gloo on CPUs), rendezvous at rank 0's
    host on a port it picks: every element checked."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    where = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            where = (socket.gethostname(), s.getsockname()[1])
    addr, port = comm.bcast(where, root=0)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    dev = torch.device("cuda", local % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=120))
    try:
        sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
        x = torch.full((nbytes // 4,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        sync()
        ok = bool(torch.all(x == size * (size + 1) / 2))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        return ok, (time.perf_counter() - t0) / iters
    finally:
        dist.destroy_process_group()


def collective(comm, backend: str, mib: int, iters: int = 5) -> dict[str, Any] | None:
    """Run the all-reduce on every rank; rank 0 gets the joined result, the others None."""
    nbytes = mib << 20
    try:
        ok, seconds = (mpi_allreduce(comm, nbytes, iters) if backend == "mpi"
                       else torch_allreduce(comm, backend, nbytes, iters))
        mine = {"ok": ok, "seconds": seconds, "error": "" if ok else "wrong values"}
    except Exception as e:  # noqa: BLE001 -- reported, with the rank, by rank 0
        mine = {"ok": False, "seconds": 0.0, "error": f"{type(e).__name__}: {e}"}
    every = comm.gather(mine, root=0)
    if every is None:
        return None
    bad = [f"rank {i}: {r['error']}" for i, r in enumerate(every) if not r["ok"]]
    seconds = max(r["seconds"] for r in every)
    return {"backend": backend, "ranks": len(every), "bytes": nbytes, "ok": not bad, "error": "; ".join(bad),
            "seconds": seconds, **_bandwidth(nbytes, seconds, len(every))}


def run(node_report: dict[str, Any], allreduce: str | None, mib: int) -> tuple[dict | None, str, int]:
    """Gather every rank's report at rank 0: (the cluster report, its table) on rank 0, (None, "")
    elsewhere, and the exit code every rank returns."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    node_report["node"]["rank"] = comm.Get_rank()
    reports = comm.gather(node_report, root=0)
    coll = collective(comm, allreduce, mib) if allreduce else None
    result, text, code = None, "", 0
    if comm.Get_rank() == 0:
        agg = aggregate(reports)
        failing = sum(1 for n in agg["nodes"] for s in n["status"].values() if s == FAIL)
        code = 1 if failing or agg["differences"] or (coll and not coll["ok"]) else 0
        result = {"tool": "tb-doctor", "schema": 1, "mode": "cluster", "world_size": comm.Get_size(),
                  "nodes": [{k: n[k] for k in ("hostname", "ranks", "status")} for n in agg["nodes"]],
                  "differences": agg["differences"], "allreduce": coll, "ranks": reports,
                  "summary": {s: sum(1 for n in agg["nodes"] for v in n["status"].values() if v == s)
                              for s in STATUSES}, "exit_code": code}
        text = render(agg, comm.Get_size(), coll)
    return result, text, comm.bcast(code, root=0)
