"""`build.py lock` resolves every stale set before it writes any (issue 65): an arm64 set whose
release publishes no aarch64 wheel used to fail with pip's marker text after the other sets'
lock files were already written. Now nothing is written, and the failure names the package and
the matrix.yaml rule that keeps the release's cells off linux/arm64."""

from __future__ import annotations

import pytest
import yaml

from trainbase.define import pip_locks
from trainbase.errors import TrainbaseError


def test_a_set_without_aarch64_wheels_stops_the_lock_before_any_file_is_written(tmp_path, monkeypatch):
    good = pip_locks.LockSet("pytorch9.9.0-cuda99.1-py3.12", "3.12", ("torch==9.9.0",))
    arm = pip_locks.LockSet(
        "pytorch9.9.0-cuda99.1-py3.12-arm64", "3.12", ("torch==9.9.0",), (), "manylinux_2_35_aarch64"
    )

    def resolve(ls, log=print):
        if ls.wheel_platform:
            raise TrainbaseError(
                f"lock {ls.name}: pip could not resolve torch==9.9.0:\n"
                "ERROR: No matching distribution found for torch==9.9.0"
            )
        return pip_locks.header(ls)

    monkeypatch.setattr(pip_locks, "resolve", resolve)
    with pytest.raises(TrainbaseError) as e:
        pip_locks.write(tmp_path, [good, arm])
    text = str(e.value)
    assert "no lock file was written" in text and not list((tmp_path / "locks").glob("*.txt"))
    assert "torch publishes no wheel for manylinux_2_35_aarch64" in text
    rule = yaml.safe_load(text.split("e.g.\n", 1)[1])[0]
    assert rule["when"] == {"platform": "linux/arm64", "cuda": "99.1"} and "reason" in rule

    monkeypatch.setattr(pip_locks, "resolve", lambda ls, log=print: pip_locks.header(ls))
    assert pip_locks.write(tmp_path, [good, arm]) == [good.path, arm.path]
