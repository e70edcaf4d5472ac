"""The mutation run's incremental step (tests/conformance/inputs.py, issue 72): a check keeps its
recorded outcomes only while every file its evidence read (a module imported from its .pyc counts
as its source, a folder it listed, a repository file handed to a subprocess), its own text, its
evidence and its mutants digest as they did; any change to one of them re-runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance import inputs, mutation


def test_repo_paths_are_relative_and_a_pyc_is_its_source(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    assert inputs.repo_path(tmp_path, tmp_path / "pkg" / "mod.py") == "pkg/mod.py"
    assert inputs.repo_path(tmp_path, tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc") == "pkg/mod.py"
    assert inputs.repo_path(tmp_path, tmp_path / ".venv" / "lib" / "x.py") is None
    assert inputs.repo_path(tmp_path, tmp_path / "reports" / "junit.xml") is None
    assert inputs.repo_path(tmp_path, "/etc/hostname") is None
    assert inputs.repo_path(tmp_path, 3) is None


def _tracked(root: Path, code: str) -> list[str]:
    """What a fresh interpreter, tracking from its start, read of ``root`` running ``code``."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])\n"
        "from pathlib import Path\n"
        "from tests.conformance import inputs\n"
        "t = inputs.Tracker(Path(sys.argv[2])); t.start()\n"
        f"{code}\n"
        "print('\\n'.join(t.paths()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(mutation.ROOT), str(root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    )
    return out.stdout.split()


def test_the_tracker_sees_opens_imports_listings_and_subprocess_arguments(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    (tmp_path / "listed").mkdir()
    (tmp_path / "planted_pkg").mkdir()
    (tmp_path / "planted_pkg" / "__init__.py").write_text("")
    (tmp_path / "planted_pkg" / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "tool.sh").write_text("true\n")
    seen = _tracked(
        tmp_path,
        "open('data.txt').read(); import os; os.listdir('listed'); import planted_pkg.mod\n"
        "import subprocess; subprocess.run(['sh', str(Path.cwd() / 'tool.sh')], check=True)",
    )
    assert {"data.txt", "listed/", "planted_pkg/mod.py", "tool.sh"} <= set(seen), seen
    assert set(inputs.ALWAYS) <= set(seen)
    # the import system's own scan of a folder is not a listing: only its conftest/__init__ count
    assert "planted_pkg/" not in seen and {"planted_pkg/conftest.py", "planted_pkg/__init__.py"} <= set(seen), seen


def test_the_digest_moves_with_a_file_a_listing_a_new_conftest_and_the_checks_own_text(tmp_path):
    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "d").mkdir()
    paths = ["a.py", "d/", "conftest.py"]
    first = inputs.digest(tmp_path, paths, "check text")
    assert inputs.digest(tmp_path, paths, "check text") == first
    assert inputs.digest(tmp_path, paths, "check text, edited") != first
    (tmp_path / "a.py").write_text("A = 2\n")
    second = inputs.digest(tmp_path, paths, "check text")
    assert second != first
    (tmp_path / "d" / "new").write_text("")
    third = inputs.digest(tmp_path, paths, "check text")
    assert third != second
    (tmp_path / "conftest.py").write_text("")  # was "<gone>": a conftest that appears changes what runs
    assert inputs.digest(tmp_path, paths, "check text") != third


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Two checks of a planted plan with a record of their inputs, the repository root moved to
    tmp_path so their files can be edited."""
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    for rel in inputs.ALWAYS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("pinned\n")
    (tmp_path / "helper.py").write_text("H = 1\n")
    (tmp_path / "other.py").write_text("O = 1\n")
    ms = [
        mutation.Mutant("test_a.py::test_a", "noop", "k1", "test_a.py:1", "test_a", "test_a", "", ("t::a",)),
        mutation.Mutant("test_b.py::test_b", "noop", "k2", "test_b.py:1", "test_b", "test_b", "", ("t::b",)),
    ]
    sources = {"test_a.py": "def test_a(): assert 1\n", "test_b.py": "def test_b(): assert 1\n"}
    per_check = {
        "test_a.py::test_a": {"files": ["helper.py"]},
        "test_b.py::test_b": {"files": ["other.py"]},
    }
    for cid, e in per_check.items():
        e["digest"] = inputs.digest(tmp_path, e["files"], mutation.own_text(cid, ms, sources))
    record = {
        "outcomes": {m.id: {"killed": True, "by": "t"} for m in ms},
        "inputs": mutation.inputs_block(per_check),
    }
    return tmp_path, ms, sources, record


def test_an_unchanged_check_keeps_its_record_and_a_changed_one_reruns(planted):
    root, ms, sources, record = planted
    assert set(mutation.unchanged_checks(record, ms, sources)) == {"test_a.py::test_a", "test_b.py::test_b"}
    (root / "helper.py").write_text("H = 2\n")  # what test_a's evidence read
    assert set(mutation.unchanged_checks(record, ms, sources)) == {"test_b.py::test_b"}
    edited = {**sources, "test_b.py": "def test_b(): assert 2\n"}  # the check's own text
    assert set(mutation.unchanged_checks(record, ms, edited)) == set()


def test_a_check_without_recorded_inputs_or_with_a_new_mutant_reruns(planted):
    _, ms, sources, record = planted
    assert mutation.unchanged_checks({"outcomes": record["outcomes"]}, ms, sources) == {}
    extra = [
        *ms,
        mutation.Mutant("test_a.py::test_a", "remove", "k3", "test_a.py:1", "test_a", "test_a.assert1", "", ("t::a",)),
    ]
    assert set(mutation.unchanged_checks(record, extra, sources)) == {"test_b.py::test_b"}


def test_the_shared_pins_rerun_everything(planted):
    root, ms, sources, record = planted
    (root / "requirements-dev.lock").write_text("a new pin\n")
    assert mutation.unchanged_checks(record, ms, sources) == {}


def test_the_record_holds_the_inputs_of_every_planned_check():
    import json

    record = json.loads(mutation.RECORD.read_text())
    planned = {m.check for m in mutation.current_plan()[0]}
    assert set(record.get("inputs", {}).get("checks", {})) == planned
    files = record["inputs"]["files"]
    assert all(not os.path.isabs(p) and not p.startswith(".venv/") for p in files)
