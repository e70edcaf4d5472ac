"""Fixtures for unit tests: a copy of the repository's inputs that a test may break."""

from pathlib import Path

import pytest
import yaml

from ..conftest import ROOT, copy_inputs


@pytest.fixture(autouse=True)
def _a_checkout_lock_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """scripts/test.sh runs the unit tests beside its build of the ci profile, which holds this
    checkout's lock (trainbase/cli/checkout_lock.py) for the whole build. A unit test that calls
    build.py's main on the repository itself (its executor faked, its report under tmp_path) takes
    a lock of its own instead of being refused; on a scratch copy (`workdir`) the real lock stays,
    and the lock's own tests (test_bad_input.py) use one."""
    from trainbase.cli import checkout_lock

    real = checkout_lock.lock_path
    here = ROOT.resolve()
    monkeypatch.setattr(
        checkout_lock,
        "lock_path",
        lambda root: tmp_path / "trainbase.lock" if Path(root).resolve() == here else real(root),
    )


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
