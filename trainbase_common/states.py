"""The states of a cell's build job, shared by the build side (which sets them and writes them
into the build report) and the conformance suite (which tests the images a report says are
usable). A StrEnum: the report's JSON carries the plain values ("built", "cached", ...).

The conformance suite reads a build report through this module alone (and trainbase_common's
safe_io), never through the build package."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from . import safe_io


class JobState(StrEnum):
    QUEUED = "queued"  # planned, waiting for its parent or a free slot
    STARTING = "starting"  # handed to a worker
    BUILDING = "building"  # docker build running
    BUILT = "built"  # built now, tagged
    CACHED = "cached"  # this recipe's immutable tag already existed (engine or registry)
    FAILED = "failed"  # the build (or its base image) failed
    REFUSED = "refused"  # never started: an input is not verified (a pending checksum)
    SKIPPED = "skipped"  # never started: its parent did not complete
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C / SIGTERM

    @property
    def usable(self) -> bool:
        """The image exists, complete, under this recipe's tag: it may be tested and published."""
        return self in USABLE

    @property
    def bad(self) -> bool:
        """A terminal state that makes the run fail and skips the cells built on this one."""
        return self in BAD

    @property
    def pending(self) -> bool:
        return self in PENDING


USABLE = frozenset({JobState.BUILT, JobState.CACHED})
BAD = frozenset({JobState.FAILED, JobState.REFUSED, JobState.SKIPPED, JobState.INTERRUPTED})
PENDING = frozenset({JobState.QUEUED, JobState.STARTING, JobState.BUILDING})


REPORT = "a build report of `build.py build --report`"


def build_report(report_path: str | Path) -> dict[str, Any]:
    """A build report another run wrote, checked for what every reader takes from it (``cells``:
    a list of records, each with its ``name``, and a ``status`` that is one of this module's states);
    safe_io.InputError naming the file and the first thing wrong: empty, cut short, not JSON, or
    the wrong shape (one line, for the reader to print as it is)."""
    data = safe_io.load_record(report_path, REPORT, {"cells": list})
    for i, c in enumerate(data["cells"]):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise safe_io.InputError(f"{report_path}: not {REPORT}: cells[{i}] is no cell's record")
        if "status" in c and c["status"] not in {s.value for s in JobState}:
            raise safe_io.InputError(f"{report_path}: not {REPORT}: {c['name']}'s status is {c.get('status')!r}")
    return data


def usable_images(report_path: str | Path) -> list[str]:
    """The image references a build report (`build.py --report`) says are usable, in its order."""
    data = build_report(report_path)
    return [c["image"] for c in data["cells"] if c.get("image") and c.get("status") in USABLE]
