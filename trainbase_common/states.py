"""The states of a cell's build job, shared by the build side (which sets them and writes them
into the build report) and the conformance suite (which tests the images a report says are
usable). A StrEnum: the report's JSON carries the plain values ("built", "cached", ...).

Standard library only: the conformance suite reads
a build report through this module alone, never through the build package."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path


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


def usable_images(report_path: str | Path) -> list[str]:
    """The image references a build report (`build.py --report`) says are usable, in its order."""
    data = json.loads(Path(report_path).read_text())
    return [c["image"] for c in data.get("cells", []) if c.get("image") and JobState(c["status"]).usable]
