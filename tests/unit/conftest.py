"""Fixtures for unit tests: a copy of the repository's inputs that a test may break."""

from pathlib import Path

import pytest
import yaml

from ..conftest import ROOT, copy_inputs


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch copy of everything build.py reads, so a test can edit any of it."""
    return copy_inputs(tmp_path)


@pytest.fixture
def matrix_data() -> dict:
    return yaml.safe_load((ROOT / "matrix.yaml").read_text())


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    from trainbase.cli.main import main

    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err
