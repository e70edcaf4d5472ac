"""Foreign-architecture cells: the binfmt handler is judged by what the kernel says (enabled,
F flag), registered only when such a cell is selected, and a host that cannot run them fails
those cells up front with the fix, never an "exec format error" in the first RUN line."""
import pytest

from trainbase.build import bootstrap, emulation
from trainbase.define import pip_locks


@pytest.fixture
def binfmt(tmp_path, monkeypatch):
    monkeypatch.setattr(emulation, "BINFMT", tmp_path)
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    (tmp_path / "status").write_text("enabled\n")
    return tmp_path


def handler(d, flags="PF", state="enabled"):
    (d / "qemu-aarch64").write_text(f"{state}\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n"
                                    f"flags: {flags}\noffset 0\nmagic 7f454c46\n")


def test_a_registered_handler_with_the_fix_binary_flag_is_usable(binfmt):
    handler(binfmt)
    ok, what = emulation.handler_state("arm64")
    assert ok and "qemu-aarch64" in what


@pytest.mark.parametrize("flags, state, why", [
    ("P", "enabled", "lacks the F flag"),
    ("PF", "disabled", "disabled"),
])
def test_a_handler_containers_cannot_use_is_not_usable(binfmt, flags, state, why):
    handler(binfmt, flags, state)
    ok, what = emulation.handler_state("arm64")
    assert not ok and why in what


def test_native_cells_need_nothing_and_foreign_ones_are_registered_only_when_selected(binfmt, monkeypatch):
    calls = []
    monkeypatch.setattr(emulation, "_register", lambda arch: calls.append(arch) or handler(binfmt))
    log = []
    assert emulation.ensure({"amd64"}, log.append) == {"amd64": "native"} and calls == [] and log == []
    got = emulation.ensure({"amd64", "arm64"}, log.append)
    assert calls == ["arm64"] and got["arm64"].startswith("emulated")
    assert "registered the qemu-aarch64 binfmt handler, because arm64 cells are selected" in log[0]


def test_a_host_that_cannot_run_arm64_says_how_to_fix_it(binfmt, monkeypatch):
    monkeypatch.setattr(emulation, "_register", lambda arch: "update-binfmts not found: binfmt-support is not installed")
    with pytest.raises(emulation.EmulationError, match=r"arm64 cells are selected, but this amd64 host cannot run "
                                                       r"arm64 binaries: no qemu-aarch64 handler.*scripts/setup.sh"):
        emulation.ensure({"arm64"}, lambda s: None)


def test_each_architecture_has_its_own_bootstrap_name(monkeypatch):
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    assert bootstrap.bootstrap_ref("debian:12.15-slim") == "trainbase-bootstrap/debian:12.15-slim"
    assert bootstrap.bootstrap_ref("debian:12.15-slim", "amd64") == "trainbase-bootstrap/debian:12.15-slim"
    assert bootstrap.bootstrap_ref("debian:12.15-slim", "arm64") == "trainbase-bootstrap/arm64/debian:12.15-slim"


def test_another_platforms_lock_accepts_every_older_manylinux():
    tags = pip_locks.platform_tags("manylinux_2_35_aarch64")
    assert tags[0] == "manylinux_2_35_aarch64" and "manylinux_2_17_aarch64" in tags and tags[-1] == "manylinux2014_aarch64"
    ls = pip_locks.LockSet("x-arm64", "3.11", ("a==1",), (), "manylinux_2_35_aarch64")
    assert ls.inputs_sha256 != pip_locks.LockSet("x", "3.11", ("a==1",)).inputs_sha256
    assert "# platform: manylinux_2_35_aarch64" in pip_locks.header(ls)
