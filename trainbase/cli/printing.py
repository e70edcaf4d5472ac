"""What the actions print: the render and drift summaries, the cell table, a cell's explanation,
the lock counts and the build's closing summary. Results go to stdout, problems to stderr; the
actions decide, these functions only say it."""

from __future__ import annotations

import json
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..define.invocation import build_py
from ..define.matrix import Cell, Matrix

if TYPE_CHECKING:
    from ..run.executor import Executor


def rendered(
    count: int, changed: list[str], removed: list[str], stale_locks: list[str], new: frozenset[str] = frozenset()
) -> None:
    """``new``: the cells among ``changed`` that had no images/ directory before (issue 65)."""
    grown = [n for n in changed if n in new]
    print(f"rendered {count} cells: {len(grown)} new, {len(changed) - len(grown)} changed, {len(removed)} removed")
    for n in changed:
        print(f"  {'new' if n in new else 'changed':<8} {n}")
    for n in removed:
        print(f"  removed  {n}")
    if stale_locks:
        for s in stale_locks:
            print(f"  lock     {s}", file=sys.stderr)
        print(f"error: some pip locks are missing or stale; run `{build_py()} lock`", file=sys.stderr)


def leftovers(lines: list[str]) -> None:
    """References to versions the axes dropped (Matrix.leftovers): a warning each, on stderr."""
    for line in lines:
        print(f"warning: leftover of a dropped version: {line}", file=sys.stderr)


def drift(problems: list[str]) -> None:
    cells = sorted({p.split(":", 1)[0] for p in problems if not p.startswith(("lock:", "figures:"))})
    print(
        f"drift: {len(problems)} problem(s)"
        + (f" in {len(cells)} cell(s)" if cells else "")
        + f"; run `{build_py()} render`"
        f" (or `{build_py()} lock`) and commit:",
        file=sys.stderr,
    )
    for p in problems:
        print(f"  {p}", file=sys.stderr)


def no_drift(count: int) -> None:
    print(f"ok: images/ matches matrix.yaml + templates/ for {count} cells")


def stale_before_build(problems: list[str]) -> None:
    print(
        "error: images/ or locks/ differ from what matrix.yaml renders; the build uses the committed "
        f"files, so fix that first (`{build_py()} render`, or `{build_py()} lock`):",
        file=sys.stderr,
    )
    for p in problems[:10]:
        print(f"  {p}", file=sys.stderr)


def cells(records: list[dict[str, Any]], *, as_json: bool) -> None:
    """``list``: one object ``{"cells": [...], "count": N}``, or a table with a count line."""
    if as_json:
        json.dump({"cells": records, "count": len(records)}, sys.stdout, indent=2)
        print()
        return
    width = max((len(r["name"]) for r in records), default=10)
    for rec in records:
        if rec["excluded"]:
            print(f"{rec['name']:<{width}}  EXCLUDED  {rec['excluded']}")
        else:
            prof = ",".join(rec["profiles"]) or "-"
            print(f"{rec['name']:<{width}}  {rec['tag']}  {prof}")
    n_ex = sum(1 for r in records if r["excluded"])
    print(f"{len(records) - n_ex} cells" + (f", {n_ex} excluded" if n_ex else ""))


def explanation(c: Cell, asked: str | None = None, fabric: list[str] | None = None) -> None:
    """``asked``: the name the person typed; an excluded framework cell has no release, so its
    own name lacks the version they asked about (`pytorch-...`): theirs is echoed (issue 65)."""
    axes = " ".join(f"{k}={v}" for k, v in c.axes.items())
    if c.excluded:
        print(f"{asked or c.name}: EXCLUDED ({axes})\n  because {c.excluded}")
    else:
        chain = f"\n  built on: {c.parent}" if c.parent else ""
        print(f"{c.name}: INCLUDED ({axes}){chain}\n  profiles: {', '.join(c.profiles) or '-'}")
        if fabric is not None:
            # matrix.yaml's fabric: what this cell's platform and IB row carry (nccl_net_plugin:
            # the NCCL network plugin NCCL loads by itself)
            print(f"  fabric: {', '.join(fabric) or '-'}")


def no_such_cell(m: Matrix, name: str) -> None:
    print(
        f"{name}: no such cell. Names look like {m.included[0].name}; `build.py list --all` lists every combination.",
        file=sys.stderr,
    )


def locks_written(written: int, current: int, removed: int) -> None:
    print(f"{written} lock file(s) written, {current} current, {removed} no cell uses removed")


def bases_locked(lock_file: str, locked: int, unlocked: int) -> None:
    print(f"{lock_file}: {locked} base(s) locked, {unlocked} unlocked")


def build_summary(report: ModuleType, b: Executor) -> None:
    """The summary table; if it cannot be printed (a terminal that went away, a rich bug), a
    plain line per cell instead -- never a traceback in place of the result and exit code."""
    try:
        report.summary(b)
    except Exception as e:  # noqa: BLE001 -- the run's result must still reach the person
        print(f"(summary table failed: {type(e).__name__}: {e}; plain summary follows)", file=sys.stderr)
        for j in b.jobs.values():
            print(f"{j.name}\t{j.tag}\t{j.status}\t{j.reason or ''}")
