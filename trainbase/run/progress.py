"""Live build progress: a rich table on a terminal, one line per event (plus a heartbeat)
when the output is a log (CI)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trainbase_common.states import JobState

from .report import fmt_seconds, plain_console

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

    from ..build.plan import Job
    from .report import Run


class Progress:
    """Live progress: a rich table on a terminal, one line per event (plus a heartbeat) in CI."""

    HEARTBEAT = 60.0

    def __init__(self, b: Run) -> None:
        self.b = b
        self.live: Live | None = None
        self.t0 = time.monotonic()
        self.last_beat = self.t0
        self.tty = b.out.isatty() if hasattr(b.out, "isatty") else False

    def _table(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        t = Table(title=f"trainbase build ({fmt_seconds(time.monotonic() - self.t0)})", expand=False)
        for col in ("cell", "status", "time", "last log line"):
            t.add_column(col, overflow="ellipsis", no_wrap=True, max_width=70 if col != "time" else 8)
        for j in self.b.jobs.values():
            # Text, never markup: log lines and engine errors carry `[...]` (issue 27)
            t.add_row(
                Text(j.name),
                Text(str(j.status)),
                Text(fmt_seconds(j.duration) if j.duration else ""),
                Text(j.last_line if j.status == JobState.BUILDING else (j.reason or "")),
            )
        return t

    def start(self) -> None:
        counts: dict[JobState, int] = {}
        for j in self.b.jobs.values():
            counts[j.status] = counts.get(j.status, 0) + 1
        self.b.out.write("build: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + "\n")
        if self.tty:
            from rich.live import Live

            self.live = Live(self._table(), refresh_per_second=2, transient=False, console=plain_console(self.b.out))
            self.live.start()

    def tick(self) -> None:
        if self.live:
            self.live.update(self._table())
        elif time.monotonic() - self.last_beat > self.HEARTBEAT:
            self.last_beat = time.monotonic()
            for j in self.b.jobs.values():
                if j.status == JobState.BUILDING:
                    self.b.out.write(f"  ... {j.name}: building {fmt_seconds(j.duration)} | {j.last_line[:100]}\n")
            self.b.out.flush()

    def event(self, j: Job) -> None:
        if not self.live:
            done = sum(not x.status.pending for x in self.b.jobs.values())
            why = f" ({j.reason})" if j.reason and j.status != JobState.BUILT else ""
            self.b.out.write(f"[{done}/{len(self.b.jobs)}] {j.name}: {j.status} in {fmt_seconds(j.duration)}{why}\n")
            self.b.out.flush()

    def stop(self) -> None:
        if self.live:
            self.live.update(self._table())
            self.live.stop()
