"""`tb-doctor` command line: run the checks, print one line per check (or JSON), exit 0 when
nothing fails, 1 when something does, 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

from . import SCHEMA_VERSION
from .core import CHECKS, EXPECTABLE, FAIL, STATUSES, WARN, Node, Result, run_checks, select

MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def node_report(node: Node, results: list[Result], seconds: float) -> dict[str, Any]:
    contract = next((r.facts for r in results if r.id == "launch.contract" and "rank" in r.facts), {})
    if contract.get("launcher") == "single":  # a lone process has no rank to speak of
        contract = {}
    summary = {s: sum(1 for r in results if r.status == s) for s in STATUSES}
    return {
        "tool": "tb-doctor",
        "schema": SCHEMA_VERSION,
        "mode": "node",
        "node": {
            "hostname": socket.gethostname(),
            "rank": contract.get("rank"),
            "local_rank": contract.get("local_rank"),
            "image": (node.manifest() or {}).get("name"),
        },
        "expect": list(node.expect),
        "checks": [r.as_dict() for r in results],
        "summary": summary,
        "seconds": round(seconds, 3),
        "exit_code": 1 if summary[FAIL] else 0,
    }


def render_node(report: dict[str, Any]) -> str:
    n = report["node"]
    where = f"rank {n['rank']} on {n['hostname']}" if n["rank"] is not None else n["hostname"]
    lines = [f"tb-doctor: {where}, image {n['image'] or '(no manifest)'}"]
    width = max((len(c["id"]) for c in report["checks"]), default=10)
    for c in report["checks"]:
        lines.append(f"  {MARK[c['status']]}  {c['id'].ljust(width)}  {c['summary']}")
        if c["status"] in (WARN, FAIL):
            lines.append(f"        {' ' * width}  fix: {c['hint']}")
    s = report["summary"]
    lines.append(
        f"{len(report['checks'])} checks: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, "
        f"{s['skip']} skipped, in {report['seconds']:.1f} s"
    )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tb-doctor",
        description="Preflight checks of this trainbase image on "
        "this node: GPUs and driver, RDMA devices and providers, memory limits, MPI, "
        "NCCL and the launch contract.",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON document (docs/doctor.schema.json)")
    ap.add_argument("--only", metavar="ID[,ID]", help="run only these checks (an id or a prefix: nccl, ib)")
    ap.add_argument(
        "--expect",
        metavar="gpu,ib",
        default="",
        help="hardware that must be here: its absence fails instead of skipping",
    )
    ap.add_argument(
        "--nccl-log",
        metavar="FILE",
        help="an NCCL INFO log of a real job (NCCL_DEBUG=INFO, "
        "NCCL_DEBUG_SUBSYS=INIT,NET,ENV): gpudirect.nccl judges its channels instead of starting NCCL here",
    )
    ap.add_argument("--list", action="store_true", help="list the checks and exit")
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="under mpirun/srun: every rank checks, rank 0 prints one node x check table",
    )
    ap.add_argument(
        "--allreduce",
        nargs="?",
        const="auto",
        choices=("auto", "mpi", "gloo", "nccl"),
        help="with --cluster: a value-checked all-reduce between all ranks (auto: nccl with GPUs "
        "and torch, else the image's MPI)",
    )
    ap.add_argument("--allreduce-mib", type=int, default=8, help="all-reduce size in MiB (default 8)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    expect = tuple(e for e in a.expect.split(",") if e)
    if set(expect) - set(EXPECTABLE):
        ap.error(f"--expect takes {', '.join(EXPECTABLE)}")
    if a.allreduce and not a.cluster:
        ap.error("--allreduce needs --cluster (it runs between the ranks of a launch)")
    if a.list:
        for c in CHECKS.values():
            print(f"{c.id:16} {c.title}")
        return 0
    try:
        checks = select([o for o in (a.only or "").split(",") if o])
    except ValueError as e:
        ap.error(str(e))
    nccl_log = os.path.abspath(a.nccl_log) if a.nccl_log else None
    if nccl_log and not os.access(nccl_log, os.R_OK):
        ap.error(f"--nccl-log {a.nccl_log}: not a readable file")
    node = Node(expect=expect, nccl_log=nccl_log)
    t0 = time.monotonic()
    report = node_report(node, run_checks(node, checks), time.monotonic() - t0)
    if not a.cluster:
        print(json.dumps(report, indent=2) if a.json else render_node(report))
        return report["exit_code"]
    _image_python_for_mpi4py(node)
    try:
        from . import cluster

        backend = a.allreduce
        if backend == "auto":
            backend = "nccl" if _torch_with_gpus() else "mpi"
        # the launcher's environment as this process got it, before MPI_Init adds its own
        result, text, code = cluster.run(report, backend, a.allreduce_mib, env=node.env)
    except ImportError as e:
        print(f"tb-doctor: --cluster needs mpi4py from the image's Python: {e}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2) if a.json else text, flush=True)
    return code


def _image_python_for_mpi4py(node: Node) -> None:
    """--cluster needs the image's mpi4py: a launcher that starts ranks with a bare PATH
    (ssh, orted) may have found another python3. Re-run under the manifest's Python then."""
    try:
        import mpi4py  # noqa: F401

        return
    except ImportError:
        pass
    prefix = node.component("python", "prefix")
    py = f"{prefix}/bin/python" if prefix else ""
    # not realpath: a venv's python is a link to the system one; the venv is told by sys.prefix
    if py and os.access(py, os.X_OK) and os.path.abspath(sys.prefix) != os.path.abspath(prefix):
        os.execv(py, [py, "-m", "trainbase_doctor", *sys.argv[1:]])


def _torch_with_gpus() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
