"""``locks/security-rebuilds.json``: the security rebuild epoch of each OS row.

An image's tag is the hash of its recipe, so distro security fixes published after a build
never reach it by themselves (its packages are whatever the mirror served that day). The
scheduled security check (trainbase/supply/security_check.py) finds OS rows whose published
images miss a fix from the distro's security suite and writes the day it found them here;
the os block renders that day as ``ARG TRAINBASE_SECURITY_REBUILD=<day>`` before its ``apt-get
upgrade`` (an ARG's value is part of the cache key of every RUN after it, so the layer is
really rebuilt and takes the fixes). The recipe changes by that one line: every cell of the
row -- and every child, through its parent's recipe -- gets a new immutable tag, built,
tested and promoted through the same gate as any other change, and reverting the line goes
back to the previous tags. A row absent from the file renders no line (no rebuild yet)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

from trainbase_common import safe_io

from ..errors import TrainbaseError

FILE = "locks/security-rebuilds.json"
SCHEMA = 1


def load(root: Path) -> dict[str, dict[str, Any]]:
    """OS row -> {"epoch": "YYYY-MM-DD", "fixes": [...]}; {} when the file does not exist."""
    p = root / FILE
    if not p.exists():
        return {}
    try:
        doc = json.loads(p.read_text())
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}, expected {SCHEMA}")
        rows: dict[str, dict[str, Any]] = doc["os"]
        for entry in rows.values():
            date.fromisoformat(entry["epoch"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise TrainbaseError(f"{FILE}: {e}") from None
    return rows


def epoch(rows: dict[str, dict[str, Any]], os_row: str) -> str | None:
    entry = rows.get(os_row)
    return entry["epoch"] if entry else None


def write(root: Path, rows: dict[str, dict[str, Any]]) -> None:
    safe_io.atomic_write(root / FILE, json.dumps({"schema": SCHEMA, "os": dict(sorted(rows.items()))}, indent=2) + "\n")
