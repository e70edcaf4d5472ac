"""Shared pytest configuration: the repository root, and a scratch copy of everything
build.py reads (so a test can break any of it without touching the checkout)."""

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ("matrix.yaml", "templates", "imagefs", "locks", "patches", "images", ".dockerignore", ".hadolint.yaml")


def copy_inputs(dest: Path) -> Path:
    for name in INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def pend_miniforge_arm64(matrix: Path) -> None:
    """A scratch checkout's Miniforge aarch64 installer back to an unverified checksum, as it was
    until 2e267c3: the delivery tests need a repository with a platform the build refuses (the
    Ubuntu arm64 twins then), and the real matrix has none since the pin landed. Edited as text
    (YAML comments and order kept); fails if the entry moved. Re-render the checkout after it."""
    text = matrix.read_text()
    pinned = re.compile(r"(Miniforge3-[^/\s]+-Linux-aarch64\.sh\n)(\s+)sha256: [0-9a-f]{64}[^\n]*\n", re.MULTILINE)
    text, n = pinned.subn(r"\1\2sha256: pending\n\2pending_reason: unverified in this test's scratch checkout\n", text)
    assert n == 1, "matrix.yaml has no pinned Miniforge aarch64 installer to set back to pending"
    matrix.write_text(text)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--control-junit",
        default=None,
        metavar="JUNIT.xml",
        help="the self-test (tests/conformance/test_broken_variants.py) takes each base image's "
        "control from this JUnit of a conformance run on the same images, instead of running it",
    )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    return copy_inputs(tmp_path)


def cell(**axes: str) -> str:
    """The name of the one cell of matrix.yaml with these axis values (platform linux/amd64
    unless named): tests say which cell they mean by what it is, so a version bump renames
    it here instead of in every test."""
    from trainbase.define.matrix import load

    axes.setdefault("platform", "linux/amd64")
    found = [c.name for c in load(ROOT / "matrix.yaml").included if all(getattr(c, a) == v for a, v in axes.items())]
    if len(found) != 1:
        raise LookupError(f"matrix.yaml has {len(found)} cells with {axes}: {found[:4]}")
    return found[0]
