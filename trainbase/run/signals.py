"""SIGTERM handled as Ctrl-C is, at every stage of a run (issue 64).

CI runners, `timeout` and Kubernetes stop a job with SIGTERM, a person with Ctrl-C (SIGINT).
Python turns only SIGINT into KeyboardInterrupt; SIGTERM's default kills the process where it
stands: no child stopped, no container removed, no report, exit 143 with nothing said. Here both
raise the same exception in the main thread, so every `finally` and every stage's handler runs
(builds stopped, containers removed, the report written with "interrupted"), and the exit code
still says which signal it was: 128 + its number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Stopped(KeyboardInterrupt):
    """A KeyboardInterrupt that knows which signal raised it."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signum_of(e: BaseException) -> int:
    return int(getattr(e, "signum", signal.SIGINT))


def exit_code(e: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended."""
    return 128 + signum_of(e)


def name_of(e: BaseException) -> str:
    return signal.Signals(signum_of(e)).name


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def as_interrupt() -> Iterator[None]:
    """Within: SIGTERM (and SIGINT) raise Stopped in the main thread. Elsewhere (a worker
    thread cannot set handlers): nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the parent set to be ignored stays ignored (`nohup`, a shell's background job and
    # SIGINT): that was the caller's choice
    old = {
        s: signal.signal(s, _raise_stopped)
        for s in (signal.SIGTERM, signal.SIGINT)
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
