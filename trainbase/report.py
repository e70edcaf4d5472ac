"""What a build run ends with: the summary table a person reads at a glance, and the JSON
report machines read (CI fan-out; the conformance suite through states.usable_images)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainbase_common import engine

from .publish import ALIAS
from trainbase_common.states import JobState


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s"


def build_report(x) -> dict:
    """The JSON report of an executor's run (schema 1): one record per job, plan order."""
    engine_version = engine.server_version()
    counts: dict[str, int] = {}
    for j in x.jobs.values():
        counts[j.status] = counts.get(j.status, 0) + 1
    return {
        "schema": 1,
        "run_id": x.run_id,
        "engine": {"docker_host": os.environ.get("DOCKER_HOST", ""), "server_version": engine_version},
        "namespace": x.m.spec.naming.namespace,
        "registry": x.opts.registry if x.opts.push else None,
        "publish_error": x.publish_error,
        "counts": counts,
        "cells": [
            {
                "name": j.name,
                "selected": j.selected,
                "image": j.image,
                "tag": j.tag,
                "alias": j.image.rsplit(":", 1)[0] + ":" + ALIAS,
                "recipe": j.rendered.recipe,
                "parent": j.cell.parent,
                "axes": j.cell.axes,
                "status": j.status,
                "reason": j.reason,
                "duration_s": round(j.duration, 1) if j.duration is not None else None,
                "size_bytes": j.size,
                "image_id": j.image_id,
                "pushed": j.pushed,
                "repo_digest": j.repo_digest,
                "log": j.log,
                "manifest": j.rendered.context.manifest,
                "supply": _supply(x, j),
            }
            for j in x.jobs.values()
        ],
    }


def _supply(x, j) -> dict | None:
    """Where the cell's supply-chain documents are (inputs lock, inventory, SBOM, audit,
    budget, release notes), when this run wrote or has them."""
    sc = getattr(x, "supply", None)
    if sc is None:
        return None
    d = sc.cell_dir(j)
    docs = {p.name: str(p) for p in sorted(d.glob("*"))} if d.is_dir() else {}
    return {"dir": str(d), "documents": docs, "seconds": round(j.supply_s, 1) if j.supply_s is not None else None}


def summary(b, out=None) -> None:
    """The table a person reads at the end: cell, tag, status, duration, size, digest."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out or sys.stdout, width=200)
    t = Table(title="trainbase build summary")
    for col in ("cell", "tag", "status", "time", "size", "image id / digest", "reason"):
        t.add_column(col, overflow="fold")
    for j in b.jobs.values():
        digest = j.repo_digest or (j.image_id[:19] if j.image_id else "")
        size = f"{j.size / 1e9:.2f} GB" if j.size else ""
        t.add_row(j.name + ("" if j.selected else " (dep)"), j.tag, j.status, fmt_seconds(j.duration), size, digest,
                  j.reason if j.status != JobState.CACHED else "")
    console.print(t)
    counts: dict[str, int] = {}
    for j in b.jobs.values():
        counts[j.status] = counts.get(j.status, 0) + 1
    console.print("result: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


def write_report(b, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(build_report(b), indent=2) + "\n")
