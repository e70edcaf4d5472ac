"""Whether a process of this host is still there (for what a killed run left: its supply
containers, its docker builds)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True while PID runs (or cannot be signalled by us: someone else's); a zombie, exited but
    not yet reaped by its parent, is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
