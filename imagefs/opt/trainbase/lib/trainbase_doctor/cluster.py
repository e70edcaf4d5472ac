"""Multi-node mode: every rank of an MPI launch runs its checks, rank 0 gathers them and prints
one node x check table that points at the odd node out (a missing device or mount, another
driver, another image), then optionally times a value-checked all-reduce between the nodes.

The gathering uses the image's own MPI through mpi4py (every trainbase image has it, linked to
its MPI); the aggregation is pure and unit-tested without MPI.

Two checks exist only here, across ranks (issue 22): ``cluster.world`` (MPI's world is as large
as the launch: `srun` without a PMI the MPI reaches starts one-rank worlds that would otherwise
pass as a cluster) and ``cluster.userns`` (the ranks of a node share a user namespace, or
cross-memory attach between them is refused). Every rank adds both to its report; rank 0
decides ``cluster.userns`` for the ranks of each node."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from .core import CHECKS, FAIL, OK, SKIP, STATUSES, WARN

WORST = {FAIL: 3, WARN: 2, OK: 1, SKIP: 0}
WORLD, USERNS = "cluster.world", "cluster.userns"
CLUSTER_CHECKS = {
    WORLD: ("world", "MPI's world is the world the launcher started"),
    USERNS: ("userns", "the ranks of a node share one user namespace (cross-memory attach)"),
}
SLURM_PMI_FIX = (
    "start the tasks with a PMI the image's MPI speaks: `srun --mpi=pmix` (Open MPI; version 5 speaks PMIx "
    "only) or `srun --mpi=pmi2` (Intel MPI); `srun --mpi=list` shows what this Slurm offers, "
    "MpiDefault in slurm.conf the default; under pyxis/enroot the same flag on the srun line"
)
USERNS_FIX = (
    "start the ranks of a node in one user namespace: Charliecloud `ch-run --join` (one namespace per node), "
    "Apptainer `--sharens`, enroot: one container per node that the tasks join (pyxis does; "
    "`srun enroot start` per task does not)"
)


def _int_var(env: dict[str, str], var: str) -> int | None:
    try:
        return int(env[var]) if var in env else None
    except ValueError:
        return None


def expected_world(env: dict[str, str]) -> tuple[str, int, dict[str, int]] | None:
    """(variable, size) of the launcher that started this process, and every size variable
    seen. The process's own launcher comes first: mpirun's OMPI_COMM_WORLD_SIZE, Hydra's
    PMI_SIZE (with MPI_LOCALRANKID), then srun's SLURM_NTASKS (mpirun inside an sbatch script
    also passes on the batch step's SLURM_NTASKS, which counts something else), WORLD_SIZE last."""
    said = {
        v: n
        for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE")
        if (n := _int_var(env, v)) is not None
    }
    order = (
        ["OMPI_COMM_WORLD_SIZE"]
        + (["PMI_SIZE"] if "MPI_LOCALRANKID" in env or "SLURM_NTASKS" not in said else [])
        + ["SLURM_NTASKS", "WORLD_SIZE"]
    )
    source = next((v for v in order if v in said), None)
    return (source, said[source], said) if source else None


def world_check(mpi_size: int, env: dict[str, str]) -> dict[str, Any]:
    """The ``cluster.world`` entry of a rank's report: fails when MPI's world (comm.Get_size())
    is smaller than the launcher's, saying which variable said what and why the ranks did not
    meet. ``env`` is the environment before MPI_Init."""
    exp = expected_world(env)
    if exp is None:
        return _entry(
            WORLD,
            OK,
            f"MPI's world has {mpi_size} rank(s); no launcher variable names a size "
            "(SLURM_NTASKS, OMPI_COMM_WORLD_SIZE, PMI_SIZE, WORLD_SIZE)",
            facts={"mpi_size": mpi_size},
        )
    source, want, said = exp
    facts = {"mpi_size": mpi_size, "expected": want, "source": source, "said": said}
    if mpi_size >= want:
        return _entry(WORLD, OK, f"MPI's world has {mpi_size} rank(s), as {source} says", facts=facts)
    others = ", ".join(f"{v}={n}" for v, n in said.items() if v != source)
    head = (
        f"MPI's world has {mpi_size} rank(s) but {source}={want}"
        + (f" (also {others})" if others else "")
        + ": the ranks never met, each MPI_Init made a world of its own"
    )
    pmix = "PMIX_RANK" in env or "PMIX_NAMESPACE" in env
    if source == "OMPI_COMM_WORLD_SIZE":
        why = (
            "mpirun (Open MPI) started them, but the MPI this Python loaded is not the launcher's (a host's "
            "mpirun starting the image's MPI, or mpi4py linked to another MPI)"
        )
        fix = (
            "launch with the image's own mpirun (`mpirun ... tb-launch tb-doctor --cluster` with the image's "
            "PATH), and check `python -c 'import mpi4py; print(mpi4py.get_config())'` names the image's MPI"
        )
    elif source == "PMI_SIZE" and "SLURM_NTASKS" not in said:
        why = "Hydra (Intel MPI's or MPICH's mpiexec) started them, but this process's MPI is not Hydra's"
        fix = "launch with the image's own mpiexec/mpirun, the one tb-doctor's mpi.launcher check finds"
    elif source == "SLURM_NTASKS" and "PMI_SIZE" in said:
        why = (
            "srun offered PMI-2 (--mpi=pmi2: PMI_SIZE) and the MPI did not use it (Open MPI 5, for one, speaks "
            "PMIx only and starts singletons)"
        )
        fix = SLURM_PMI_FIX
    elif source == "SLURM_NTASKS" and pmix:
        why = "srun offered PMIx (PMIX_RANK/PMIX_NAMESPACE are set) and the MPI did not use it"
        fix = (
            "for an MPI without PMIx support (Intel MPI unless told to load a PMIx library through "
            "I_MPI_PMI_LIBRARY) use `srun --mpi=pmi2`; Open MPI: `ompi_info | grep -i pmix` shows its PMIx; "
            + SLURM_PMI_FIX
        )
    elif source == "SLURM_NTASKS":
        why = "srun started them with no PMI (--mpi=none, or MpiDefault=none), so no MPI could find the others"
        fix = SLURM_PMI_FIX
    else:
        why = "no MPI launcher started them (WORLD_SIZE comes from torchrun or the job spec)"
        fix = "start the ranks with mpirun or `srun --mpi=pmix` for --cluster (it gathers through MPI)"
    return _entry(WORLD, FAIL, f"{head}; {why}", hint=fix, facts=facts)


def user_namespace() -> str | None:
    """This process's user namespace, as /proc/self/ns/user names it (user:[inode])."""
    try:
        return os.readlink("/proc/self/ns/user")
    except OSError:
        return None


def userns_entry(ns: str | None) -> dict[str, Any]:
    """The ``cluster.userns`` entry of a rank's report; rank 0 turns it into a warning when the
    ranks of a node differ (userns_split)."""
    if ns is None:
        return _entry(USERNS, SKIP, "skipped: /proc/self/ns/user is not readable", facts={"userns": None})
    return _entry(USERNS, OK, f"user namespace {ns}", facts={"userns": ns})


def userns_split(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes whose ranks run in more than one user namespace: [{"hostname", "namespaces":
    {namespace: [ranks]}}]. Namespaces are compared within a node only (their numbers are per host)."""
    by_host: dict[str, dict[str, list]] = {}
    for r in sorted(reports, key=lambda r: r["node"].get("rank") or 0):
        ns = next((c["facts"].get("userns") for c in r["checks"] if c["id"] == USERNS), None)
        if ns:
            by_host.setdefault(r["node"]["hostname"], {}).setdefault(ns, []).append(r["node"].get("rank"))
    return [{"hostname": h, "namespaces": spaces} for h, spaces in by_host.items() if len(spaces) > 1]


def _entry(cid: str, status: str, summary: str, hint: str = "", facts: dict | None = None) -> dict[str, Any]:
    return {
        "id": cid,
        "title": CLUSTER_CHECKS[cid][1],
        "status": status,
        "summary": summary,
        "hint": hint,
        "facts": facts or {},
        "seconds": 0.0,
    }


def with_check(report: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """Add (or replace) a check entry in a rank's report and recount its summary and exit code."""
    report["checks"] = [c for c in report["checks"] if c["id"] != entry["id"]] + [entry]
    report["summary"] = {s: sum(1 for c in report["checks"] if c["status"] == s) for s in STATUSES}
    report["exit_code"] = 1 if report["summary"][FAIL] else 0
    return report


def _mark_userns(reports: list[dict[str, Any]]) -> None:
    """Rank 0's verdict on cluster.userns: a warning, with the fix, on every rank of a split node."""
    for split in userns_split(reports):
        spaces = "; ".join(f"{ns}: rank(s) {_ranges(rs)}" for ns, rs in split["namespaces"].items())
        summary = (
            f"the ranks on {split['hostname']} run in {len(split['namespaces'])} user namespaces ({spaces}): "
            "cross-memory attach (process_vm_readv) between them is refused, so MPI's single-copy path "
            "fails: Open MPI falls back at about half the speed, UCX-based stacks (PyTorch's) may abort"
        )
        for r in reports:
            if r["node"]["hostname"] == split["hostname"] and any(c["id"] == USERNS for c in r["checks"]):
                own = next(c for c in r["checks"] if c["id"] == USERNS)
                with_check(r, _entry(USERNS, WARN, summary, hint=USERNS_FIX, facts=own["facts"]))


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
    lowest rank) and the differences between nodes, each naming the nodes that differ. A node
    whose ranks differ in user namespace gets cluster.userns as a warning (on the ranks' reports)."""
    _mark_userns(reports)
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
        nodes.append(
            {
                "hostname": host,
                "ranks": [r["node"].get("rank") for r in rs],
                "status": status,
                "checks": first,
                "warnings": _cluster_warnings(rs),
                "failures": [
                    {"rank": r["node"].get("rank"), "id": c["id"], "summary": c["summary"], "hint": c["hint"]}
                    for r in rs
                    for c in r["checks"]
                    if c["status"] == FAIL
                ],
            }
        )
    return {"nodes": nodes, "differences": differences(nodes)}


def _cluster_warnings(rs: list[dict]) -> list[dict[str, str]]:
    """The cross-rank checks' warnings of one node's ranks, once each: no rank's own output shows them."""
    seen: dict[str, dict[str, str]] = {}
    for c in (c for r in rs for c in r["checks"] if c["id"] in CLUSTER_CHECKS and c["status"] == WARN):
        seen.setdefault(c["summary"], {"id": c["id"], "summary": c["summary"], "hint": c["hint"]})
    return list(seen.values())


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
                        out.append(
                            {
                                "check": cid,
                                "fact": key,
                                "nodes": lacking,
                                "summary": f"{cid}: {key} {item} missing on {', '.join(lacking)} (present on "
                                f"{', '.join(having)})",
                            }
                        )
                continue
            groups: dict[str, list[str]] = {}
            for h, v in values.items():
                groups.setdefault(json.dumps(v, sort_keys=True), []).append(h)
            ordered = sorted(groups.values(), key=len, reverse=True)
            majority = ordered[0] if len(ordered[0]) > len(ordered[1]) else []
            odd = [h for h in values if h not in majority]
            said = ", ".join(f"{h}={values[h]}" for h in odd)
            out.append(
                {
                    "check": cid,
                    "fact": key,
                    "nodes": odd,
                    "summary": f"{cid}: {key} differs: {said}"
                    + (f" (the other {len(majority)} node(s): {values[majority[0]]})" if majority else ""),
                }
            )
    for cid in CHECKS:
        failing = [n["hostname"] for n in nodes if n["status"].get(cid) == FAIL]
        if failing and len(failing) < len(hosts):
            out.append(
                {
                    "check": cid,
                    "fact": "status",
                    "nodes": failing,
                    "summary": f"{cid} fails on {', '.join(failing)} only",
                }
            )
    return out


def render(agg: dict[str, Any], world: int, collective: dict | None) -> str:
    ids = [c for c in [*CHECKS, *CLUSTER_CHECKS] if any(c in n["status"] for n in agg["nodes"])]
    heads = ["node", "ranks"] + [CHECKS[c].label if c in CHECKS else CLUSTER_CHECKS[c][0] for c in ids]
    rows = [
        [n["hostname"], _ranges([r for r in n["ranks"] if r is not None])]
        + [
            n["status"].get(c, "-").upper() if n["status"].get(c) in (WARN, FAIL) else n["status"].get(c, "-")
            for c in ids
        ]
        for n in agg["nodes"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(heads, *rows)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()  # noqa: E731
    short = next(
        (n["checks"][WORLD]["facts"] for n in agg["nodes"] if n["status"].get(WORLD) == FAIL and WORLD in n["checks"]),
        None,
    )
    expected = f", expected {short['expected']} ({short['source']})" if short else ""
    lines = [f"tb-doctor: {len(agg['nodes'])} node(s), {world} rank(s){expected}", fmt(heads)] + [fmt(r) for r in rows]
    if agg["differences"]:
        lines.append("odd one out:")
        lines += [f"  - {d['summary']}" for d in agg["differences"]]
    warns = [(n["hostname"], w) for n in agg["nodes"] for w in n.get("warnings", [])]
    if warns:
        lines.append("warnings:")
        lines += [f"  - {host}: {w['id']}: {w['summary']}\n      fix: {w['hint']}" for host, w in warns]
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
    return (
        f"all-reduce ({c['backend']}, {c['ranks']} ranks, {c['bytes'] >> 20} MiB): values correct, "
        f"{c['seconds'] * 1e3:.2f} ms, algbw {c['algbw_GBps']:.2f} GB/s, busbw {c['busbw_GBps']:.2f} GB/s"
    )


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
    dist.init_process_group(
        backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size, timeout=timedelta(seconds=120)
    )
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
        ok, seconds = (
            mpi_allreduce(comm, nbytes, iters) if backend == "mpi" else torch_allreduce(comm, backend, nbytes, iters)
        )
        mine = {"ok": ok, "seconds": seconds, "error": "" if ok else "wrong values"}
    except Exception as e:  # noqa: BLE001 -- reported, with the rank, by rank 0
        mine = {"ok": False, "seconds": 0.0, "error": f"{type(e).__name__}: {e}"}
    every = comm.gather(mine, root=0)
    if every is None:
        return None
    bad = [f"rank {i}: {r['error']}" for i, r in enumerate(every) if not r["ok"]]
    seconds = max(r["seconds"] for r in every)
    return {
        "backend": backend,
        "ranks": len(every),
        "bytes": nbytes,
        "ok": not bad,
        "error": "; ".join(bad),
        "seconds": seconds,
        **_bandwidth(nbytes, seconds, len(every)),
    }


def run(
    node_report: dict[str, Any], allreduce: str | None, mib: int, env: dict[str, str] | None = None
) -> tuple[dict | None, str, int]:
    """Gather every rank's report at rank 0: (the cluster report, its table) on rank 0, (None, "")
    elsewhere, and the exit code every rank returns. ``env``: the environment the launcher gave
    (before MPI_Init, which may add its own variables); this process's by default."""
    env = dict(os.environ) if env is None else env
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    node_report["node"]["rank"] = comm.Get_rank()
    with_check(node_report, world_check(comm.Get_size(), env))
    with_check(node_report, userns_entry(user_namespace()))
    reports = comm.gather(node_report, root=0)
    coll = collective(comm, allreduce, mib) if allreduce else None
    result, text, code = None, "", 0
    if comm.Get_rank() == 0:
        agg = aggregate(reports)
        failing = sum(1 for n in agg["nodes"] for s in n["status"].values() if s == FAIL)
        code = 1 if failing or agg["differences"] or (coll and not coll["ok"]) else 0
        result = {
            "tool": "tb-doctor",
            "schema": 1,
            "mode": "cluster",
            "world_size": comm.Get_size(),
            "nodes": [{k: n[k] for k in ("hostname", "ranks", "status")} for n in agg["nodes"]],
            "differences": agg["differences"],
            "allreduce": coll,
            "ranks": reports,
            "summary": {s: sum(1 for n in agg["nodes"] for v in n["status"].values() if v == s) for s in STATUSES},
            "exit_code": code,
        }
        text = render(agg, comm.Get_size(), coll)
    return result, text, comm.bcast(code, root=0)
