"""Fixtures for unit tests: a copy of the repository's inputs that a test may break."""
import shutil
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ("matrix.yaml", "templates", "imagefs", "locks", "patches", "images", ".hadolint.yaml")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch copy of everything build.py reads, so a test can edit any of it."""
    for name in INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name)
        elif src.exists():
            shutil.copy2(src, tmp_path / name)
    return tmp_path


@pytest.fixture
def matrix_data() -> dict:
    return yaml.safe_load((ROOT / "matrix.yaml").read_text())


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    from trainbase.cli import main

    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err
