"""Where a cell's build time went, read from its own log (BuildKit's ``--progress=plain``).

Each step of the log is a ``#N [stage i/n] INSTRUCTION ...`` header, then ``#N DONE 12.3s``,
``#N CACHED`` or ``#N ERROR ...``; the image export is ``#N exporting to image``. This module
turns that into one record per step (its stage, kind, seconds, cached) and the seconds by kind:

- ``compile``: a RUN that configures or compiles (make, cmake, ninja, nvcc, configure, a
  framework extension built by pip: TransformerEngine, DeepSpeed's ops, Horovod);
- ``pip`` / ``apt``: a RUN that installs from PyPI / the distribution;
- ``copy`` (COPY, ADD), ``export`` (the layers written to the engine), ``other`` (the rest).

Stages of one Dockerfile build side by side, so the kinds add up to more than the cell's wall
time where they overlap; the longest steps name what to make faster. The record is read by the
run's JSON report (``steps``, ``seconds_by_kind``) and its summary ("where the time went").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

KINDS = ("compile", "pip", "apt", "copy", "export", "other")

_HEADER = re.compile(r"^#(\d+) \[(?P<stage>[^\]]+)\] (?P<instr>.*)$")
_EXPORT = re.compile(r"^#(\d+) exporting to (image|oci image format|docker image format)")
_DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s\s*$")
_CACHED = re.compile(r"^#(\d+) CACHED\s*$")
_ERROR = re.compile(r"^#(\d+) (ERROR|CANCELED)\b")
# What makes a RUN a compile: the build tools, and the variables of the blocks whose pip
# install compiles an extension (te.j2's NVTE_*, deepspeed.j2's DS_BUILD_*, horovod.j2's
# HOROVOD_WITH_*, MAX_JOBS for any torch extension).
_COMPILE = re.compile(
    r"(^|[\s;&|(])(make|cmake|ninja|nvcc|\./configure|\./autogen\.sh)(\s|$)"
    r"|\b(MAX_JOBS|DS_BUILD_\w+|HOROVOD_WITH_\w+|NVTE_\w+)="
)
_PIP = re.compile(r"\b(pip3? install|tb-pip-install|uv pip install)\b")
_APT = re.compile(r"\bapt-get\b")


@dataclass
class Step:
    number: int
    stage: str
    instruction: str
    kind: str
    seconds: float | None = None
    cached: bool = False
    failed: bool = False

    def record(self) -> dict[str, Any]:
        return {
            "step": self.stage,
            "kind": self.kind,
            "seconds": self.seconds,
            "cached": self.cached,
            "failed": self.failed,
            # the instruction's first 120 characters: enough to tell two RUNs of a stage apart
            "instruction": self.instruction[:120],
        }


def kind_of(instruction: str) -> str:
    word = instruction.split(" ", 1)[0].upper()
    if word in ("COPY", "ADD"):
        return "copy"
    if word != "RUN":
        return "other"
    if _COMPILE.search(instruction):
        return "compile"
    if _PIP.search(instruction):
        return "pip"
    if _APT.search(instruction):
        return "apt"
    return "other"


def parse(lines: Iterable[str]) -> list[Step]:
    """The steps of one build log, in the order BuildKit first named them. [internal] steps
    (loading the Dockerfile, the context, metadata) and FROM are left out: they are the
    engine's bookkeeping, not the recipe's."""
    steps: dict[int, Step] = {}
    skip: set[int] = set()
    for raw in lines:
        line = raw.rstrip("\n")
        if m := _HEADER.match(line):
            n = int(m.group(1))
            if n in steps or n in skip:
                continue  # BuildKit prints a step's header again when its output resumes
            stage, instr = " ".join(m.group("stage").split()), m.group("instr")
            if stage == "internal" or instr.upper().startswith("FROM "):
                skip.add(n)
                continue
            steps[n] = Step(n, stage, instr, kind_of(instr))
        elif m := _EXPORT.match(line):
            n = int(m.group(1))
            steps.setdefault(n, Step(n, "export", "exporting to image", "export"))
        elif m := _DONE.match(line):
            if (step := steps.get(int(m.group(1)))) is not None:
                step.seconds = float(m.group(2))
        elif m := _CACHED.match(line):
            if (step := steps.get(int(m.group(1)))) is not None:
                step.cached, step.seconds = True, 0.0
        elif (m := _ERROR.match(line)) and (step := steps.get(int(m.group(1)))) is not None:
            step.failed = True
    return list(steps.values())


def seconds_by_kind(steps: Iterable[Step]) -> dict[str, float]:
    out = dict.fromkeys(KINDS, 0.0)
    for s in steps:
        if s.seconds:
            out[s.kind] = round(out[s.kind] + s.seconds, 1)
    return out


def from_log(path: str | None) -> list[Step]:
    """The steps of the log at `path`; none when the cell wrote no log (refused, skipped)."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse(f)
    except OSError:
        return []


def report_fields(path: str | None) -> dict[str, Any]:
    """The report's fields for one cell: every step, and the seconds by kind."""
    steps = from_log(path)
    return {"steps": [s.record() for s in steps], "seconds_by_kind": seconds_by_kind(steps)}


def fmt(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def where_the_time_went(name: str, steps: list[Step]) -> str | None:
    """One line for the summary: the kinds that took time, the longest step of the longest kind
    named. None for a cell all served from cache (nothing to say)."""
    by_kind = seconds_by_kind(steps)
    spent = [(k, v) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]) if v >= 1]
    if not spent:
        return None
    top_kind = spent[0][0]
    longest = max((s for s in steps if s.kind == top_kind and s.seconds), key=lambda s: s.seconds or 0.0)
    parts = [f"{k} {fmt(v)}" for k, v in spent]
    parts[0] += f" (longest: {longest.stage}, {fmt(longest.seconds or 0.0)})"
    return f"  {name}: " + ", ".join(parts)


def run_totals(cells: Iterable[list[Step]]) -> dict[str, float]:
    out = dict.fromkeys(KINDS, 0.0)
    for steps in cells:
        for k, v in seconds_by_kind(steps).items():
            out[k] = round(out[k] + v, 1)
    return out


def summary_lines(cells: list[tuple[str, list[Step]]]) -> list[str]:
    """The summary's paragraph: one line per cell that spent time, then the run's totals."""
    lines = [line for name, steps in cells if (line := where_the_time_went(name, steps))]
    if not lines:
        return []
    totals = run_totals(steps for _, steps in cells)
    return [
        "where the time went (step seconds from each cell's log; stages that build side by side overlap):",
        *lines,
        "  this run: " + ", ".join(f"{k} {fmt(v)}" for k, v in totals.items() if v >= 1),
    ]
