"""One writing run per checkout at a time (issue 64).

The commands that write into the checkout (images/, locks/, reports/, logs/, docs/) take an
exclusive ``fcntl.flock`` on ``.git/trainbase.lock`` (``.trainbase.lock`` at the root of a checkout
without a .git folder: a worktree, a tarball) for as long as they run; a
second one is refused at once (exit 2), naming the holder's pid and command. The kernel drops the
lock when the holder's file closes -- a killed run leaves nothing to clean up; the file's content
(pid, command) is only what the refusal says.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

from ..errors import TrainbaseError

LOCK_FILE = ".trainbase.lock"

# what writes into the checkout; `build --dry-run` and `bump --dry-run` write nothing and take no lock
WRITERS = frozenset({"build", "render", "lock", "lock-bases", "promote", "bump", "catalogue"})


class CheckoutBusy(TrainbaseError):
    """Another run holds the checkout."""


def lock_path(root: Path) -> Path:
    """Inside .git where there is one: never a file git could track, stage or see changed (a
    repository that does not ignore .trainbase.lock -- a fork's, a test's scratch one -- would
    otherwise refuse a revert over it)."""
    git = root / ".git"
    return git / "trainbase.lock" if git.is_dir() else root / LOCK_FILE


@contextlib.contextmanager
def hold(root: Path, command: list[str]) -> Iterator[None]:
    """Hold ROOT's lock for the block; CheckoutBusy at once when another process holds it."""
    path = lock_path(root)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckoutBusy(f"another trainbase run holds this checkout: {holder(fd)} (lock: {path})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{shlex.join(command)}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def holder(fd: int) -> str:
    """`pid N (command ...)` of the lock file's content, as far as it was written."""
    pid, _, command = os.pread(fd, 4096, 0).decode(errors="replace").partition("\n")
    return f"pid {pid.strip() or '?'} (command {command.strip() or '?'})"
