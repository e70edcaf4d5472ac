"""The build plan: which images to build, in which order, which share a stage, which are
already there and which cannot be built. Pure: it runs nothing and asks the engine nothing
(what exists is a predicate handed in), so every rule here is unit-tested without Docker.

Framework cells are built FROM their parent cell's immutable tag, so a cell's parent (and the
parent's parent) join the plan and come first: the standard library's graph sorter orders
them, selection order breaking ties so the plan reads like the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from typing import TextIO

from trainbase_common.states import JobState

from ..define.matrix import Cell, Matrix
from ..render.recipes import Rendered


@dataclass
class Job:
    """One image of the plan, and what became of it (the executor fills in the rest)."""

    rendered: Rendered
    image: str  # namespace/name:immutable-tag
    selected: bool  # False: built only because a selected cell needs it
    status: JobState = JobState.QUEUED
    reason: str | None = None
    started: float | None = None
    ended: float | None = None
    log: str | None = None
    size: int | None = None
    image_id: str | None = None
    last_line: str = ""
    pushed: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # tags this run found already published
    repo_digest: str | None = None
    supply_s: float | None = None  # seconds of the supply-chain step (SBOM, audits, budgets)
    failure_kind: str | None = None  # run/failures.py: transient | environment | recipe | unknown
    fix: str | None = None  # the fix for this failure's very cause, where one is known

    @property
    def cell(self) -> Cell:
        return self.rendered.cell

    @property
    def name(self) -> str:
        return self.cell.name

    @property
    def repository(self) -> str:
        """Where it is published: shared by the platforms of one recipe."""
        return self.cell.image or self.cell.name

    @property
    def platform(self) -> str:
        return self.cell.platform

    @property
    def tag(self) -> str:
        return self.rendered.tag

    @property
    def parent(self) -> str | None:
        return self.cell.parent

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.monotonic()) - self.started


class Plan:
    def __init__(self, m: Matrix, rendered: dict[str, Rendered], selected: list[Cell]):
        self.m = m
        ns = m.spec.naming.namespace
        wanted = {c.name for c in selected}
        graph: dict[str, set[str]] = {}
        todo = [c.name for c in selected]
        while todo:  # the selection and every parent it needs
            name = todo.pop()
            if name in graph:
                continue
            parent = rendered[name].cell.parent
            graph[name] = {parent} if parent else set()
            if parent:
                todo.append(parent)
        rank: dict[str, int] = {}  # the first selected cell that needs it
        for i, c in enumerate(selected):
            up: str | None = c.name
            while up:
                rank[up] = min(rank.get(up, i), i)
                up = rendered[up].cell.parent
        sorter = TopologicalSorter(graph)
        sorter.prepare()
        order: list[str] = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready(), key=lambda n: (rank[n], n))
            order += ready
            sorter.done(*ready)
        self.jobs: dict[str, Job] = {
            n: Job(rendered=rendered[n], image=f"{ns}/{n}:{rendered[n].tag}", selected=n in wanted) for n in order
        }

    # -- structure ---------------------------------------------------------------------------
    def children(self, name: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.parent == name]

    def levels(self) -> dict[str, int]:
        """FROM depth of each job: 0 for base cells, parent's + 1 for framework cells."""
        level: dict[str, int] = {}
        for n, j in self.jobs.items():  # parents come first
            level[n] = level[j.parent] + 1 if j.parent in level else 0
        return level

    def stage_groups(self) -> dict[str, list[str]]:
        """Base cells whose first stage (OS, compilers, IB userspace) renders byte-identical:
        BuildKit builds those layers once and every cell of the group reuses them."""
        groups: dict[str, list[str]] = {}
        for j in self.jobs.values():
            if j.rendered.os_stage:
                groups.setdefault(j.rendered.os_stage[:12], []).append(j.name)
        return groups

    # -- what needs no build, what cannot be built -----------------------------------------------
    def refuse_unverified(self) -> None:
        """A cell that downloads an artifact without a verified checksum is refused."""
        for j in self.jobs.values():
            plat = j.cell.platform
            pending = [a for a in j.rendered.context.artifacts if self.m.spec.artifacts[a].file_for(plat).pending]
            if pending and j.status == JobState.QUEUED:
                a = self.m.spec.artifacts[pending[0]].file_for(plat)
                j.status, j.reason = (
                    JobState.REFUSED,
                    (f"artifact {pending[0]} has no verified sha256 ({' '.join((a.pending_reason or '').split())})"),
                )

    def sources_needed(self) -> list[str]:
        """The pinned sources the queued jobs' Dockerfiles mount (staged before any build)."""
        return list(
            dict.fromkeys(
                k for j in self.jobs.values() if j.status == JobState.QUEUED for k in j.rendered.context.sources
            )
        )

    def refuse_unsourced(self, failed: dict[str, str]) -> None:
        """A cell whose pinned source could not be staged (neither GitHub nor the mirror gave the
        pinned tree: ``failed`` says why per source) is refused; the rest builds."""
        for j in self.jobs.values():
            missing = [k for k in j.rendered.context.sources if k in failed]
            if missing and j.status == JobState.QUEUED:
                j.status, j.reason = JobState.REFUSED, failed[missing[0]]

    def mark_cached(self, exists: Callable[[str], bool]) -> None:
        """Jobs whose immutable tag ``exists`` (in the engine) need no build."""
        for j in self.jobs.values():
            if j.status == JobState.QUEUED and exists(j.image):
                j.status, j.reason = JobState.CACHED, "this recipe's immutable tag is already in the engine"

    def propagate(self) -> None:
        """A job whose parent ended badly is skipped, with the parent named (one pass: parents
        come first in the plan)."""
        for j in self.jobs.values():
            p = self.jobs.get(j.parent) if j.parent else None
            if j.status == JobState.QUEUED and p is not None and p.status.bad:
                j.status, j.reason = JobState.SKIPPED, f"its parent {p.name} {p.status}"
                j.ended = j.ended or time.monotonic()

    def ready(self) -> list[Job]:
        """Queued jobs whose parent (if any) is usable: what may start now."""
        out = []
        for j in self.jobs.values():
            p = self.jobs.get(j.parent) if j.parent else None
            if j.status == JobState.QUEUED and (p is None or p.status.usable):
                out.append(j)
        return out

    # -- the plan a person reads ------------------------------------------------------------------
    def describe(self, out: TextIO, jobs: int) -> None:
        w = out.write
        w(f"plan: {len(self.jobs)} image(s), {sum(j.selected for j in self.jobs.values())} selected, -j {jobs}\n")
        level = self.levels()
        verbs = {
            JobState.QUEUED: "build",
            JobState.CACHED: "cached",
            JobState.REFUSED: "REFUSED",
            JobState.SKIPPED: "skip",
        }
        for lv in sorted(set(level.values())):
            w(f"  step {lv + 1}:\n")
            for n in [n for n in self.jobs if level[n] == lv]:
                j = self.jobs[n]
                extra = f"  FROM {j.parent}" if j.parent else ""
                dep = "" if j.selected else "  (needed by a selected cell)"
                w(f"    {verbs.get(j.status, str(j.status)):<8} {j.image}{extra}{dep}\n")
                if j.reason and j.status != JobState.CACHED:
                    w(f"             {j.reason}\n")
        for g in [g for g in self.stage_groups().values() if len(g) > 1]:
            w(f"  shared os/ib stage (built once): {', '.join(g)}\n")
