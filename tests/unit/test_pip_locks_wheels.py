"""Issue 52: the refresh's lock resolution takes wheels wherever the target has them (an
sdist's metadata comes from running its build backend: third-party code), lets a package
with no wheel through as its sdist by name, and says which it built."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from trainbase.define import pip_locks
from trainbase.errors import TrainbaseError

LS = pip_locks.LockSet(name="py3.12", python="3.12", requirements=("wheelpkg==1.0", "sdistonly==2.0"))


def fake_pip(no_wheel: set[str], calls: list[list[str]]):
    """pip install --dry-run --report, as far as format control goes: a package in `no_wheel`
    publishes only an sdist."""

    def run(cmd, check=False, capture_output=True, text=True, env=None):
        calls.append(cmd)
        binary_only = "--only-binary=:all:" in cmd
        allowed_source = {c.split("=", 1)[1] for c in cmd if c.startswith("--no-binary=")}
        for name in sorted(no_wheel):
            if binary_only and name not in allowed_source:
                return subprocess.CompletedProcess(
                    cmd,
                    1,
                    "",
                    f"ERROR: Could not find a version that satisfies "
                    f"the requirement {name}==2.0 (from versions: none)\n"
                    f"ERROR: No matching distribution found for {name}==2.0\n",
                )
        report = Path(cmd[cmd.index("--report") + 1])
        install = [
            {
                "metadata": {"name": n, "version": v},
                "download_info": {
                    "url": f"https://files/{n}-{v}" + (".tar.gz" if n in no_wheel else "-py3-none-any.whl"),
                    "archive_info": {"hashes": {"sha256": "ab" * 32}},
                },
            }
            for n, v in (("wheelpkg", "1.0"), ("sdistonly", "2.0"))
        ]
        report.write_text(json.dumps({"install": install}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


@pytest.fixture
def native(monkeypatch):
    """The target's own interpreter is on this machine (pip could build an sdist with it)."""
    monkeypatch.setattr(pip_locks, "resolver_for", lambda ls: ("/usr/bin/python3.12", []))


def test_every_package_with_a_wheel_is_resolved_wheels_only(native, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(pip_locks.subprocess, "run", fake_pip(set(), calls))
    text = pip_locks.resolve(LS, log=lambda s: None)
    assert len(calls) == 1 and "--only-binary=:all:" in calls[0]
    assert "built from sdists" not in text and "wheelpkg==1.0" in text


def test_a_package_without_a_wheel_is_built_from_its_sdist_by_name_and_reported(native, monkeypatch):
    calls: list[list[str]] = []
    logged: list[str] = []
    monkeypatch.setattr(pip_locks.subprocess, "run", fake_pip({"sdistonly"}, calls))
    text = pip_locks.resolve(LS, log=logged.append)
    assert calls[-1][-2:] == ["--only-binary=:all:", "--no-binary=sdistonly"]
    assert "# built from sdists (no wheel for the target): sdistonly\n" in text
    assert any("sdistonly has no wheel for Python 3.12 here: its sdist is built" in line for line in logged)
    assert any(line.endswith("resolved from sdists: sdistonly") for line in logged)


def test_a_requirement_pip_cannot_find_at_all_still_fails_naming_it(native, monkeypatch):
    def run(cmd, check=False, capture_output=True, text=True, env=None):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for nosuch==9\n")

    monkeypatch.setattr(pip_locks.subprocess, "run", run)
    with pytest.raises(TrainbaseError, match="No matching distribution found for nosuch"):
        pip_locks.resolve(LS, log=lambda s: None)
