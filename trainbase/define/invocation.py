"""How the person ran this tool, for the commands a hint names (issue 65): a hint that says
`python build.py` sends a user who ran `.venv/bin/python build.py` to an interpreter that may
lack the dependencies."""

from __future__ import annotations

import sys
from pathlib import Path


def build_py() -> str:
    """The interpreter as a path relative to the working directory where it lies below it
    (`.venv/bin/python build.py`), else its name (`python3 build.py`)."""
    exe = Path(sys.executable)
    try:
        short = str(exe.relative_to(Path.cwd()))
    except ValueError:
        short = exe.name or "python"
    return f"{short} build.py"
