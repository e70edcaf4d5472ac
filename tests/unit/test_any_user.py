"""Issue 62: an image works as any user id. The start-up hook (imagefs trainbase_user.py, loaded by
trainbase.pth) and the runtime-tier check's verdict (test_runtime.py::start_up_problems), driven
without Docker. The check itself runs in the runtime tier on every image with a framework."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainbase_conformance.checks import test_runtime as rt

from .conftest import ROOT

HOOK = ROOT / "imagefs" / "opt" / "trainbase" / "lib" / "trainbase_user.py"


@pytest.fixture
def hook(monkeypatch):
    spec = importlib.util.spec_from_file_location("trainbase_user_under_test", HOOK)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setenv("TRAINBASE_USER_HOOK", "0")  # importing must not touch this process
    spec.loader.exec_module(mod)
    return mod


def test_a_uid_without_passwd_entry_gets_a_name_and_the_shared_home(hook, tmp_path, monkeypatch):
    shared = tmp_path / "home-trainbase"
    shared.mkdir()
    monkeypatch.setattr(hook, "SHARED_HOME", str(shared))
    env = {"HOME": "/", "PATH": "/usr/bin"}
    changes = hook.adopt(env, 1000680001, known=False)
    assert changes == {"USER": "uid1000680001", "LOGNAME": "uid1000680001", "HOME": str(shared)}
    assert env["HOME"] == str(shared) and env["USER"] == "uid1000680001"


def test_a_read_only_root_gets_a_private_home_under_tmpdir(hook, tmp_path, monkeypatch):
    monkeypatch.setattr(hook, "SHARED_HOME", str(tmp_path / "absent"))
    monkeypatch.setattr(hook.tempfile, "gettempdir", lambda: str(tmp_path))
    env: dict[str, str] = {}
    changes = hook.adopt(env, 4242, known=False)
    home = tmp_path / "home-4242"
    assert changes["HOME"] == str(home) and home.is_dir() and (home.stat().st_mode & 0o777) == 0o700


def test_root_and_users_with_a_writable_home_are_left_alone(hook, tmp_path):
    env = {"HOME": str(tmp_path)}
    assert hook.adopt(env, 0, known=True) == {} and env == {"HOME": str(tmp_path)}


def test_what_the_user_set_is_kept(hook, tmp_path, monkeypatch):
    monkeypatch.setattr(hook, "SHARED_HOME", str(tmp_path))
    env = {"USER": "alice", "HOME": str(tmp_path)}
    assert hook.adopt(env, 1000680002, known=False) == {}
    assert hook.adopt({"TRAINBASE_USER_HOOK": "0", "HOME": "/"}, 1000680002, known=False) == {}


def test_getpass_answers_for_a_uid_without_passwd_entry_once_the_hook_ran(tmp_path):
    """What TorchInductor does (getpass.getuser()), as a process would run it: without the hook
    the uid's missing passwd entry is a KeyError; with it, the uid's name."""
    code = (
        "import getpass, os, sys, pwd\n"
        "pwd.getpwuid = lambda uid: (_ for _ in ()).throw(KeyError(f'getpwuid(): uid not found: {uid}'))\n"
        "os.environ.pop('USER', None); os.environ.pop('LOGNAME', None); os.environ.pop('LNAME', None);"
        " os.environ.pop('USERNAME', None)\n"
        "if sys.argv[1] == 'hook':\n"
        "    import importlib.util as u\n"
        f"    s = u.spec_from_file_location('h', {str(HOOK)!r}); m = u.module_from_spec(s); s.loader.exec_module(m)\n"
        "print(getpass.getuser())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", "LNAME", "USERNAME")}
    env["HOME"] = "/"
    without = subprocess.run(
        [sys.executable, "-c", code, "plain"], check=False, capture_output=True, text=True, env=env
    )
    assert without.returncode != 0 and "getpwuid(): uid not found" in without.stderr
    with_hook = subprocess.run(
        [sys.executable, "-c", code, "hook"],
        check=False,
        capture_output=True,
        text=True,
        env=env | {"TMPDIR": str(tmp_path)},
    )
    assert with_hook.returncode == 0, with_hook.stderr
    assert with_hook.stdout.strip() == f"uid{os.getuid()}"


def test_the_check_fails_naming_the_start_up_path_that_failed():
    report = {
        "uid": 1000680000,
        "gid": 0,
        "steps": {
            "identity": {"ok": True, "detail": "user uid1000680000, HOME /tmp/home-1000680000"},
            "torch.compile": {"ok": False, "detail": "KeyError: 'getpwuid(): uid not found: 1000680000'"},
        },
    }
    problems = rt.start_up_problems(report, rt.expected_start_up_steps({"pytorch": "2.10.0"}))
    assert problems == [
        "torch.compile: KeyError: 'getpwuid(): uid not found: 1000680000'",
        "lightning_fit: not run (the probe did not get to it)",
    ]


def test_the_check_passes_when_every_start_up_path_ran():
    steps = {n: {"ok": True, "detail": "ok"} for n in ("identity", "torch.compile", "lightning_fit", "deepspeed_op")}
    assert rt.start_up_problems({"steps": steps}, rt.expected_start_up_steps({"pytorch": "2", "deepspeed": "0"})) == []
    assert rt.expected_start_up_steps({}) == {"identity"}
    assert rt.expected_start_up_steps({"pytorch": "2.15.0", "deepspeed": "0.19.8"}) == {
        "identity",
        "torch.compile",
        "lightning_fit",
        "deepspeed_op",
    }


def test_the_check_drives_the_probe_as_an_arbitrary_uid_in_group_0():
    uid, gid = rt.ANY_UID.split(":")
    assert gid == "0" and 1_000_680_000 <= int(uid) < 1_000_690_000
    assert rt.DOCKER_WAYS["any-uid-group-0-read-only"] == dict(user=rt.ANY_UID, read_only=True, tmpfs=("/tmp",))
    assert Path(ROOT / "trainbase_conformance" / "probes" / "any_user.py").read_text() == rt.ANY_USER_PROBE


# ------------------------------------------------------------------ the check, driven whole


class _Result:
    def __init__(self, stdout: str, rc: int = 0, stderr: str = ""):
        self.stdout, self.returncode, self.stderr = stdout, rc, stderr


class _Container:
    """What Container.start gives the check: exec of the probe answers with ``answer``."""

    started: list = []

    def __init__(self, answer: _Result):
        self.answer, self.removed = answer, False

    def exec(self, cmd: str, timeout: int = 0) -> _Result:
        assert "TBANYUSER" in cmd or "any_user" in cmd or "getpass" in cmd, cmd
        return self.answer

    def remove(self) -> None:
        self.removed = True


class _Target:
    ref, name, python = "img:r1", "pytorch-image", "python3"

    def __init__(self, frameworks: dict):
        from trainbase_common.engine.containers import RunOptions

        self.manifest = {"frameworks": frameworks}
        self.caps = type("Caps", (), {"run_options": staticmethod(lambda: RunOptions())})()


def _drive(monkeypatch, answer: _Result, frameworks: dict):
    made: list = []

    def start(ref, opts, prefix=""):
        made.append((ref, opts))
        c = _Container(answer)
        made.append(c)
        return c

    monkeypatch.setattr(rt.Container, "start", staticmethod(start))
    try:
        rt.test_frameworks_start_as_any_uid_in_group_0(_Target(frameworks))
    finally:
        (_ref, opts), c = made[0], made[1]
        assert opts.user == rt.ANY_UID and opts.read_only and opts.tmpfs == ("/tmp:exec",)
        assert c.removed, "the check's container is removed whatever happened"


def _report(**steps) -> str:
    import json as _json

    body = {"uid": 1000680000, "gid": 0, "steps": {k: {"ok": ok, "detail": d} for k, (ok, d) in steps.items()}}
    return "some torch warning\nTBANYUSER " + _json.dumps(body) + "\n"


def test_the_check_fails_an_image_whose_torch_compile_dies_on_the_missing_passwd_entry(monkeypatch):
    """What b65c5a1's PyTorch image answered as --user 1000680000:0."""
    answer = _Result(
        _report(
            identity=(False, "KeyError: 'getpwuid(): uid not found: 1000680000'"),
            **{"torch.compile": (False, "KeyError: 'getpwuid(): uid not found: 1000680000'")},
            lightning_fit=(True, "one epoch, 4 steps"),
        )
    )
    with pytest.raises(AssertionError, match=r"torch.compile: KeyError: 'getpwuid\(\): uid not found: 1000680000'"):
        _drive(monkeypatch, answer, {"pytorch": "2.10.0"})


def test_the_check_fails_when_the_probe_dies_before_its_report(monkeypatch):
    with pytest.raises(AssertionError, match="the probe exited 1: Segmentation fault"):
        _drive(monkeypatch, _Result("", rc=1, stderr="Segmentation fault"), {"pytorch": "2.10.0"})


def test_the_check_passes_an_image_that_starts_as_any_uid(monkeypatch):
    ok = {"identity": (True, "user uid1000680000, HOME /tmp/home-1000680000")}
    ok |= {"torch.compile": (True, "compiled and equal to eager"), "lightning_fit": (True, "one epoch, 4 steps")}
    _drive(monkeypatch, _Result(_report(**ok)), {"pytorch": "2.10.0"})
