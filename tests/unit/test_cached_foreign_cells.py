"""Issue 57: after a reboot the binfmt handlers are gone and the images are not. A cached arm64
cell whose supply documents are made in a container of it gets its emulator registered first
(or is skipped with the emulator's fix, its tag kept); a failed supply step of a cached image
never untags it; and the summary's `next:` hint is decided from what failed, one class at a time."""

from __future__ import annotations

import errno
import io
from types import SimpleNamespace

import pytest

from trainbase.run import executor, failures, report
from trainbase_common import emulation, engine
from trainbase_common.states import JobState

from .test_build_plan_and_executor import m, make  # noqa: F401  (the matrix fixture)

ARM = "openmpi5.0.11-cuda13.0-cudnn9-debian12-arm64"
NATIVE = "openmpi5.0.11-cuda13.0-cudnn9-debian12"
FIX = "install it: `bash scripts/setup.sh`; or leave the arm64 cells out: --select platform=linux/amd64"


class FakeSupply:
    """The supply chain of a checkout with no reports/supply/ (after `git clean`, or a CI
    runner with a warm engine): every cached tag needs its documents made."""

    def __init__(self, fail: BaseException | str | None = None, events: list[str] | None = None):
        self.opts = SimpleNamespace(locked=False)
        self.fail, self.events = fail, events if events is not None else []

    def has_documents(self, j) -> bool:
        return False

    def files_complete(self, j) -> bool:
        return False

    def needs_step(self, j) -> bool:  # no recorded verdict to go by: the step runs where documents lack
        return not self.has_documents(j)

    def recorded_failure(self, j) -> str | None:  # every documented tag here passed its gates
        return None

    def after_build(self, j, size: int) -> str | None:
        self.events.append(f"supply {j.name}")
        if isinstance(self.fail, BaseException):
            raise self.fail
        return self.fail


@pytest.fixture
def cached(m, monkeypatch):  # noqa: F811
    """An executor over one cached cell: its tag exists, its documents do not; engine calls that
    would remove or retag an image are recorded."""
    removed: list[str] = []

    def build(name: str, supply: FakeSupply):
        b, _ = make(m, [name], monkeypatch=monkeypatch)
        monkeypatch.setattr(engine, "image_exists", lambda ref: True)
        monkeypatch.setattr(engine, "remove_image", lambda ref, force=False: removed.append(ref) or True)
        monkeypatch.setattr(engine, "tag", lambda src, dst: None)
        b.supply = supply
        return b

    build.removed = removed  # type: ignore[attr-defined]
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    return build


def test_a_cached_arm64_cell_gets_its_emulator_registered_before_its_supply_step(cached, monkeypatch):
    events: list[str] = []

    def ensure(arches, log):
        events.append(f"ensure {sorted(arches)}")
        log("emulation: registered the qemu-aarch64 binfmt handler (test), because arm64 images are to be run")
        return {a: "native" if a == "amd64" else "emulated (qemu-aarch64 via test)" for a in arches}

    monkeypatch.setattr(emulation, "ensure", ensure)
    b = cached(ARM, FakeSupply(events=events))
    assert b.run() == 0
    assert events == ["ensure ['arm64']", f"supply {ARM}"]  # registered first, then the container ran
    assert "registered the qemu-aarch64 binfmt handler" in b.out.getvalue()
    assert b.jobs[ARM].status == JobState.CACHED and cached.removed == []


def test_a_cached_native_cell_with_its_documents_registers_nothing(cached, monkeypatch):
    calls: list[set[str]] = []
    monkeypatch.setattr(emulation, "ensure", lambda arches, log: calls.append(set(arches)) or {})
    supply = FakeSupply()
    supply.has_documents = lambda j: True  # type: ignore[method-assign]
    b = cached(ARM, supply)
    assert b.run() == 0 and calls == [set()] and supply.events == []


def test_with_registration_impossible_the_cached_cell_is_skipped_with_the_fix_and_keeps_its_tag(cached, monkeypatch):
    def cannot(arches, log):
        if "arm64" in arches:
            raise emulation.EmulationError("arm64", "qemu's user-mode emulator is not installed", FIX)
        return {}

    monkeypatch.setattr(emulation, "ensure", cannot)
    supply = FakeSupply()
    b = cached(ARM, supply)
    assert b.run() == executor.INCOMPLETE
    j = b.jobs[ARM]
    assert j.status == JobState.SKIPPED and supply.events == []  # no container was started
    assert FIX in j.reason and "its cached tag is kept" in j.reason
    assert cached.removed == []
    out = io.StringIO()
    report.summary(b, out=out)
    assert "rerunning will fail the same way" not in out.getvalue() and FIX in out.getvalue()
    assert "1 of 1 cells left out (1 cached: tag kept, supply documents not made)" in out.getvalue()


def test_a_failed_supply_step_of_a_cached_image_keeps_its_tag_and_says_what_failed(cached, monkeypatch):
    monkeypatch.setattr(emulation, "ensure", lambda arches, log: dict.fromkeys(arches, "native"))
    b = cached(NATIVE, FakeSupply(fail=engine.EngineAPIError(409, "409 Container 14c0 is not running")))
    assert b.run() == 1
    j = b.jobs[NATIVE]
    assert j.status == JobState.FAILED and cached.removed == []
    assert j.reason.startswith("supply-chain step failed: EngineAPIError: 409 Container 14c0 is not running")
    # an engine error of a native image whose engine still answers is not known to be the recipe
    assert j.failure_kind == failures.UNKNOWN


def test_the_emulator_gone_mid_run_is_the_machine_not_the_recipe(cached, monkeypatch):
    """The run in the issue: the container of the arm64 image died at its first exec."""
    monkeypatch.setattr(emulation, "ensure", lambda arches, log: dict.fromkeys(arches, "emulated"))
    monkeypatch.setattr(emulation, "handler_state", lambda arch: (False, "no qemu-aarch64 handler registered"))
    b = cached(ARM, FakeSupply(fail=engine.EngineAPIError(409, "409 Container 14c0 is not running")))
    b.run()
    j = b.jobs[ARM]
    assert j.failure_kind == failures.ENVIRONMENT and "register the emulator again" in (j.fix or "")
    assert cached.removed == []
    text = "\n".join(report.next_steps(b))
    assert "this is the machine, not the recipe: register the emulator again" in text
    assert "rerunning will fail the same way" not in text


def test_a_freshly_built_image_that_fails_its_gate_is_untagged_and_the_recipe_is_named(cached, monkeypatch):
    b = cached(NATIVE, FakeSupply(fail="size budget: 9.1 GB over the row's 8 GB"))
    j = b.jobs[NATIVE]
    assert b._supply_chain(j) == "size budget: 9.1 GB over the row's 8 GB"
    assert cached.removed == [j.image] and j.failure_kind == failures.RECIPE


# -- one test per class of the `next:` hint, each from what failed -----------------------------------
@pytest.fixture
def native_host(monkeypatch):
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    monkeypatch.setattr(engine, "available", lambda: True)


def test_environment_the_emulator_the_engine_and_the_disk(native_host, monkeypatch):
    monkeypatch.setattr(emulation, "handler_state", lambda arch: (False, "no qemu-aarch64 handler registered"))
    got = failures.classify_build("docker build exited 1", ["exec /bin/sh: exec format error"], arch="arm64")
    assert got.kind == failures.ENVIRONMENT and "qemu-aarch64" in got.fix and "no qemu-aarch64" in got.cause
    got = failures.classify_exception(emulation.EmulationError("arm64", "needs root", "run as root"), arch="arm64")
    assert (got.kind, got.fix) == (failures.ENVIRONMENT, "run as root")
    full = failures.classify_exception(OSError(errno.ENOSPC, "No space left on device"), arch="amd64")
    assert full.kind == failures.ENVIRONMENT and "build.py prune" in full.fix
    monkeypatch.setattr(engine, "available", lambda: False)
    gone = failures.classify_exception(engine.EngineError("connection aborted"), arch="amd64")
    assert gone.kind == failures.ENVIRONMENT and "scripts/setup.sh" in gone.fix
    assert failures.next_step(gone.kind, gone.fix).startswith("this is the machine, not the recipe: start it")


def test_chance_the_network_and_a_killed_process(native_host):
    class ReadTimeout(Exception):  # requests.exceptions.ReadTimeout, by name
        pass

    assert (
        failures.classify_exception(ReadTimeout("HTTPSConnectionPool: Read timed out."), arch="amd64").kind
        == failures.TRANSIENT
    )
    assert (
        failures.classify_exception(ConnectionResetError(104, "reset by peer"), arch="amd64").kind == failures.TRANSIENT
    )
    got = failures.classify_build(
        "docker build exited 1", ["#12 ERROR: process did not complete: exit code: 137"], arch="amd64"
    )
    assert got.kind == failures.TRANSIENT and "run the same command again" in failures.next_step(got.kind, got.fix)


def test_recipe_a_pinned_input_or_a_package_name(native_host):
    for tail in (["tb-fetch: sha256 mismatch for http://x: expected 0, got 1"], ["E: Unable to locate package libfoo"]):
        got = failures.classify_build("docker build exited 100", tail, arch="amd64")
        assert got.kind == failures.RECIPE, tail
        assert "rerunning will fail the same way" in failures.next_step(got.kind, got.fix)


def test_unknown_an_exception_named_error_is_not_a_recipe_error(native_host):
    """The issue's run: `EngineAPIError: 409 ...` matched the recipe's `error: ` pattern."""
    assert (
        failures.failure_kind("supply-chain step failed: EngineAPIError: 409 Container 14c0 is not running", [])
        == failures.UNKNOWN
    )
    got = failures.classify_exception(engine.EngineAPIError(409, "409 Container 14c0 is not running"), arch="amd64")
    assert got.kind == failures.UNKNOWN and "read the log" in failures.next_step(got.kind, got.fix)


# -- the suite: a container of a foreign image starts only with its emulator -----------------------
def test_the_suite_registers_the_emulator_before_starting_a_foreign_container(monkeypatch):
    from trainbase_conformance import containers
    from trainbase_conformance import emulation as suite_emulation

    monkeypatch.setattr(suite_emulation, "host_arch", lambda: "amd64")
    monkeypatch.setattr(containers, "inspect_image", lambda ref: {"Architecture": "arm64", "Os": "linux"})
    order: list[str] = []
    monkeypatch.setattr(emulation, "ensure", lambda arches, log: order.append("ensure") or {"arm64": "emulated"})
    monkeypatch.setattr(containers.engine, "run_detached", lambda image, cmd, **kw: order.append("run") or "cid")
    containers.Container.start("trainbase/x-arm64:r1", engine.RunOptions())
    assert order == ["ensure", "run"]

    def cannot(arches, log):
        raise emulation.EmulationError("arm64", "qemu's user-mode emulator is not installed", FIX)

    monkeypatch.setattr(emulation, "ensure", cannot)
    with pytest.raises(RuntimeError, match=r"cannot start trainbase/x-arm64:r1: .*Fix: install it"):
        containers.Container.start("trainbase/x-arm64:r1", engine.RunOptions())
    assert order == ["ensure", "run"]  # nothing was started
