"""SIGINT and SIGTERM stop a run the same way at every stage (issue 64): the stage's own
handler runs, running builds are stopped, the cells not yet done are marked, the report says
which signal stopped the run in which stage, and the exit code is 128 + the signal's number.
Before, SIGTERM outside the build loop (the bases, the supply step of cached tags, publishing,
--test) killed the process where it stood: exit 143, no report, containers left behind."""

from __future__ import annotations

import io
import os
import signal

import pytest

from trainbase.define.matrix import load
from trainbase.run import executor, report, signals
from trainbase_common import engine
from trainbase_common.states import JobState

from .conftest import ROOT
from .test_build_plan_and_executor import LOCAL, make


@pytest.fixture(autouse=True)
def ctrl_c_heard():
    """Python's own SIGINT handler, whatever the test process inherited: under `nohup` or as a
    shell's background job SIGINT arrives ignored, and as_interrupt rightly leaves it so."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_sigterm_raises_like_ctrl_c_and_keeps_its_number():
    with pytest.raises(KeyboardInterrupt) as e, signals.as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signals.exit_code(e.value) == 143 and signals.name_of(e.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt) as e, signals.as_interrupt():
        os.kill(os.getpid(), signal.SIGINT)
    assert signals.exit_code(e.value) == 130
    assert signals.exit_code(KeyboardInterrupt()) == 130  # Python's own Ctrl-C


def test_a_signal_the_parent_ignored_stays_ignored():
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with signals.as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)  # nohup's choice: nothing happens
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.fixture
def m():
    return load(ROOT / "matrix.yaml")


def _kill_during(stage_fn_name, b, monkeypatch, signum=signal.SIGTERM):
    def stop(*a, **k):
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(b, stage_fn_name, stop)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_bases_are_made_stops_the_run_with_a_report(m, monkeypatch, signum):
    b, log = make(m, LOCAL, monkeypatch=monkeypatch)
    _kill_during("ensure_bases", b, monkeypatch, signum)
    code = b.run()
    assert code == 128 + signum and log == []  # nothing built after it
    name = signal.Signals(signum).name
    assert b.stopped == {"signal": name, "stage": "bases"}
    assert all(j.status == JobState.INTERRUPTED and name in j.reason for j in b.jobs.values())
    rep = report.build_report(b)
    assert rep["stopped"] == {"signal": name, "stage": "bases"}
    out = io.StringIO()
    report.summary(b, out=out)
    assert f"interrupted: {name} during bases" in out.getvalue()


def test_sigterm_in_the_supply_step_of_a_cached_tag(m, monkeypatch):
    b, log = make(m, LOCAL[2:], monkeypatch=monkeypatch)
    monkeypatch.setattr(engine, "image_exists", lambda ref: True)  # every tag cached
    monkeypatch.setattr(engine, "labelled_containers", lambda label: [])
    b.supply = type("S", (), {"needs_step": lambda self, j: True, "opts": type("O", (), {"locked": False})()})()
    _kill_during("_supply_for_cached", b, monkeypatch)
    assert b.run() == 143
    assert b.stopped == {"signal": "SIGTERM", "stage": "supply of cached tags"}


def test_sigterm_while_publishing_says_publish_stopped(m, monkeypatch):
    b, log = make(m, LOCAL[2:], monkeypatch=monkeypatch, push=True, registry="127.0.0.1:5000/tb")
    monkeypatch.setattr(b, "preflight", lambda: None)  # no registry to ask here
    _kill_during("push", b, monkeypatch)
    assert b.run() == 143
    assert b.stopped == {"signal": "SIGTERM", "stage": "publish"}
    assert b.publish_error and b.publish_error.startswith("publish: STOPPED by SIGTERM")
    assert report.build_report(b)["publish_error"] == b.publish_error


def test_sigterm_during_the_build_loop_is_143_not_130(m, monkeypatch):
    b, log = make(m, LOCAL[2:], monkeypatch=monkeypatch)

    def build_one(job):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the main thread, which waits on the pool

    monkeypatch.setattr(b, "build_one", build_one)
    monkeypatch.setattr(b, "stop", lambda: setattr(b, "interrupted", True))
    assert b.run() == 143 and b.stopped == {"signal": "SIGTERM", "stage": "build"}


def test_the_cli_says_which_signal_and_exits_with_its_number(monkeypatch, capsys):
    from trainbase.cli import main as cli

    def run(args):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(cli, "run", run)
    assert cli.main(["list"]) == 143
    assert "interrupted (SIGTERM)" in capsys.readouterr().err
    assert executor.Executor  # the module the stages live in


def _proc(root, pid, ppid, argv):
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} ({argv[0].rsplit('/', 1)[-1]}) S {ppid} 1 1 0")


def test_a_docker_build_left_by_a_killed_run_is_found_and_no_live_runs(tmp_path):
    """kill -9 of build.py leaves its `docker build` running (its own session): the next run of
    the same tag finds it -- re-parented to init -- and stops it before building (issue 64)."""
    image = "trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r0123456789ab"
    build = ["/usr/bin/docker", "build", "--progress=plain", "-f", "x/Dockerfile", "-t", image, "."]
    _proc(tmp_path, 1, 0, ["/sbin/init"])
    _proc(tmp_path, 50, 1, build)  # the leftover: its run was killed
    _proc(tmp_path, 60, 1, [*build[:-2], "-t", image.replace("r0123", "r9999"), "."])  # another tag
    _proc(tmp_path, 70, 700, ["/usr/bin/python3", "build.py", "--matrix"])
    _proc(tmp_path, 71, 70, build)  # a live run of another checkout: its own
    _proc(tmp_path, 80, 4242, build)  # this run's own
    _proc(tmp_path, 90, 1, ["/usr/bin/docker", "run", "-t", image])  # not a build
    assert executor.leftover_builds(image, 4242, proc=tmp_path) == [50]


def test_supply_containers_of_a_killed_run_are_removed_and_no_others(monkeypatch):
    from trainbase.supply import chain

    here = "node-a"
    found = [
        ("c1", "tb-supply-11111111", {"io.trainbase.supply": "1", chain.OWNER: f"{here}:111"}),  # killed
        ("c2", "tb-supply-22222222", {"io.trainbase.supply": "1", chain.OWNER: f"{here}:222"}),  # live
        ("c3", "tb-supply-33333333", {"io.trainbase.supply": "1", chain.OWNER: "node-b:111"}),  # other host
        ("c4", "tb-supply-44444444", {"io.trainbase.supply": "1"}),  # before the owner label: unknown, kept
    ]
    monkeypatch.setattr(engine, "labelled_containers", lambda label: found)
    removed = []
    monkeypatch.setattr(engine, "remove_container", removed.append)
    out = io.StringIO()
    assert chain.remove_leftovers(out, host=here, alive=lambda pid: pid == 222) == ["tb-supply-11111111"]
    assert removed == ["c1"] and "left by a run that was killed (pid 111)" in out.getvalue()
