"""What a build run ends with: the summary table a person reads at a glance, and the JSON
report machines read (CI fan-out; the conformance suite through states.usable_images)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from trainbase_common import engine, safe_io
from trainbase_common.states import JobState

from ..build import step_times
from ..deliver.publish import ALIAS
from . import failures

if TYPE_CHECKING:
    from rich.console import Console

    from ..build.plan import Job
    from ..define.matrix import Matrix


class _RunOptions(Protocol):
    @property
    def push(self) -> bool: ...
    @property
    def registry(self) -> str | None: ...


class Run(Protocol):
    """What the report and the live progress read of a run: the executor (run/executor.py),
    named by its shape so that this module does not import the module that imports it."""

    @property
    def run_id(self) -> str: ...
    @property
    def m(self) -> Matrix: ...
    @property
    def opts(self) -> _RunOptions: ...
    @property
    def jobs(self) -> dict[str, Job]: ...
    @property
    def out(self) -> TextIO: ...
    @property
    def publish_error(self) -> str | None: ...
    def incomplete_cells(self) -> set[str]: ...


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s"


def build_report(x: Run) -> dict[str, Any]:
    """The JSON report of an executor's run (schema 1): one record per job, plan order."""
    engine_version = engine.server_version()
    return {
        "schema": 1,
        "run_id": x.run_id,
        "engine": {"docker_host": os.environ.get("DOCKER_HOST", ""), "server_version": engine_version},
        "namespace": x.m.spec.naming.namespace,
        "registry": x.opts.registry if x.opts.push else None,
        "publish_error": x.publish_error,
        # Ctrl-C or SIGTERM: {"signal": "SIGTERM", "stage": "build" | "publish" | ...}; None: not stopped
        "stopped": getattr(x, "stopped", None),
        "counts": counts(x),
        # cells skipped because this host cannot run their platform (exit 3): the run is incomplete
        "incomplete": sorted(x.incomplete_cells()) if hasattr(x, "incomplete_cells") else [],
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
                "platform": j.cell.platform,
                "repository": j.repository,
                # native, or "emulated (qemu-aarch64 ...)": build times of the two do not compare
                "built": getattr(x, "emulated", {}).get(j.cell.arch, "native"),
                "status": j.status,
                "reason": j.reason,
                "failure_kind": j.failure_kind if j.status.bad else None,
                "fix": j.fix if j.status.bad else None,
                "skipped_because_of_this": skipped_because_of(x, j) if j.status.bad else [],
                "duration_s": round(j.duration, 1) if j.duration is not None else None,
                # where that time went, step by step, from the cell's own log (build/step_times.py)
                **step_times.report_fields(j.log),
                "size_bytes": j.size,
                "image_id": j.image_id,
                "pushed": j.pushed,
                "already_published": getattr(j, "present", []),
                "repo_digest": j.repo_digest,
                "log": j.log,
                "manifest": j.rendered.context.manifest,
                "supply": _supply(x, j),
            }
            for j in x.jobs.values()
        ],
    }


def _supply(x: Run, j: Job) -> dict[str, Any] | None:
    """Where the cell's supply-chain documents are (inputs lock, inventory, SBOM, audit,
    budget, release notes), when this run wrote or has them."""
    sc = getattr(x, "supply", None)
    if sc is None:
        return None
    d = sc.cell_dir(j)
    docs = {p.name: str(p) for p in sorted(d.glob("*"))} if d.is_dir() else {}
    return {"dir": str(d), "documents": docs, "seconds": round(j.supply_s, 1) if j.supply_s is not None else None}


def plain_console(out: TextIO | None = None, **kw: Any) -> Console:
    """A rich console that prints text as text: no markup, emoji codes or highlighting.
    Everything trainbase shows comes from outside -- engine errors (`executor failed running
    [/bin/bash -o pipefail -c ...]`), build log lines, cell names, paths -- and rich would parse
    `[...]` in them as markup (a MarkupError crashed the summary of a failed build, issue 27)."""
    from rich.console import Console

    return Console(file=out or sys.stdout, markup=False, emoji=False, highlight=False, **kw)


def summary(b: Run, out: TextIO | None = None) -> None:
    """The table a person reads at the end: cell, tag, status, duration, size, digest; then,
    for each failed cell, what to do next and which cells were skipped because of it."""
    from rich.table import Table
    from rich.text import Text

    console = plain_console(out, width=200)
    t = Table(title="trainbase build summary")
    for col in ("cell", "tag", "status", "time", "size", "image id / digest", "reason"):
        t.add_column(col, overflow="fold")
    for j in b.jobs.values():
        digest = j.repo_digest or (j.image_id[:19] if j.image_id else "")
        size = f"{j.size / 1e9:.2f} GB" if j.size else ""
        cells = (
            j.name + ("" if j.selected else " (dep)"),
            j.tag,
            str(j.status),
            fmt_seconds(j.duration),
            size,
            digest,
            (j.reason or "") if j.status != JobState.CACHED else "",
        )
        t.add_row(*(Text(c) for c in cells))  # Text: never parsed as markup
    console.print(t)
    for line in step_times.summary_lines([(j.name, step_times.from_log(j.log)) for j in b.jobs.values()]):
        console.print(line)
    for line in next_steps(b):
        console.print(line)
    console.print("result: " + ", ".join(f"{n} {s}" for s, n in sorted(counts(b).items())))
    for line in incomplete_lines(b):
        console.print(line)
    stopped = getattr(b, "stopped", None)
    if stopped:
        console.print(
            f"interrupted: {stopped['signal']} during {stopped['stage']}; running builds were stopped "
            "(no half-built image keeps a tag) and this record is complete: run the same command again"
        )


def incomplete_lines(b: Run) -> list[str]:
    """What a run that skipped a platform this host cannot run left out, and the fix, once."""
    skipped = getattr(b, "platform_skipped", {})
    if not skipped:
        return []
    cells = sorted(b.incomplete_cells())
    platforms = sorted(set(skipped.values()))
    first = b.jobs[next(iter(skipped))]
    # a cached tag skipped here (its supply documents need a container of it) is kept, not lost
    kept = [n for n in cells if "its cached tag is kept" in (b.jobs[n].reason or "")]
    return [
        f"INCOMPLETE (exit 3): {len(cells)} of {len(b.jobs)} cells left out"
        + (f" ({len(kept)} cached: tag kept, supply documents not made)" if kept else " (not built)")
        + f", because this host cannot run {', '.join(platforms)}: {', '.join(cells)}",
        f"  why: {first.reason}",
    ]


def counts(b: Run) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in b.jobs.values():
        out[str(j.status)] = out.get(str(j.status), 0) + 1
    return out


def skipped_because_of(b: Run, j: Job) -> list[str]:
    """The cells never built because `j` did not complete: its children, theirs, and so on."""
    out, frontier = [], [j.name]
    while frontier:
        parent = frontier.pop(0)
        for k in b.jobs.values():
            if k.parent == parent and k.status == JobState.SKIPPED:
                out.append(k.name)
                frontier.append(k.name)
    return out


def next_steps(b: Run) -> list[str]:
    """One paragraph per failed cell: the cause, whether it looks transient, what to do, where
    the log is, and the cells skipped because of it."""
    lines = []
    for j in b.jobs.values():
        if j.status not in (JobState.FAILED, JobState.REFUSED):
            continue
        kind = j.failure_kind or failures.failure_kind(j.reason or "", [])
        lines.append(f"{j.name}: {j.status}: {j.reason}")
        lines.append(f"  next: {failures.next_step(kind, j.fix)}")
        if j.log:
            lines.append(f"  log:  {j.log}")
        skipped = skipped_because_of(b, j)
        if skipped:
            lines.append(f"  skipped because of it ({len(skipped)}): {', '.join(skipped)}")
    return lines


def write_report(b: Run, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    safe_io.atomic_write(path, json.dumps(build_report(b), indent=2) + "\n")
