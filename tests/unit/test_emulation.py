"""Foreign-architecture cells: the binfmt handler is judged by what the kernel says (enabled,
F flag), registered only when such a cell is selected, and a host that cannot run them fails
those cells up front with the fix, never an "exec format error" in the first RUN line."""

import os
import platform
import subprocess
from pathlib import Path

import pytest

from trainbase.build import bootstrap
from trainbase.define import pip_locks
from trainbase_common import emulation


@pytest.fixture
def binfmt(tmp_path, monkeypatch):
    monkeypatch.setattr(emulation, "BINFMT", tmp_path)
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    (tmp_path / "status").write_text("enabled\n")
    return tmp_path


def handler(d, flags="PF", state="enabled"):
    (d / "qemu-aarch64").write_text(
        f"{state}\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {flags}\noffset 0\nmagic 7f454c46\n"
    )


def test_a_registered_handler_with_the_fix_binary_flag_is_usable(binfmt):
    handler(binfmt)
    ok, what = emulation.handler_state("arm64")
    assert ok and "qemu-aarch64" in what


@pytest.mark.parametrize(
    "flags, state, why",
    [
        ("P", "enabled", "lacks the F flag"),
        ("PF", "disabled", "disabled"),
    ],
)
def test_a_handler_containers_cannot_use_is_not_usable(binfmt, flags, state, why):
    handler(binfmt, flags, state)
    ok, what = emulation.handler_state("arm64")
    assert not ok and why in what


def test_native_cells_need_nothing_and_foreign_ones_are_registered_only_when_selected(binfmt, monkeypatch):
    calls = []
    monkeypatch.setattr(emulation, "_register", lambda arch: calls.append(arch) or handler(binfmt) or "how")
    log = []
    assert emulation.ensure({"amd64"}, log.append) == {"amd64": "native"} and calls == [] and log == []
    got = emulation.ensure({"amd64", "arm64"}, log.append)
    assert calls == ["arm64"] and got["arm64"].startswith("emulated")
    assert "registered the qemu-aarch64 binfmt handler (how), because arm64 binaries are about to run" in log[0]


def test_a_host_that_cannot_run_arm64_says_how_to_fix_it(binfmt, monkeypatch):
    monkeypatch.setattr(emulation, "_register", lambda arch: emulation.Unregistrable("no qemu", "install it"))
    with pytest.raises(
        emulation.EmulationError,
        match=r"this amd64 host cannot run arm64 binaries: no qemu-aarch64 "
        r"handler.*cannot be registered: no qemu\. Fix: install it",
    ):
        emulation.ensure({"arm64"}, lambda s: None)


# -- issue 37: qemu 10 (bookworm-backports, trixie) ships its handlers as systemd binfmt.d files and
# no longer enters them in binfmt-support's database; `update-binfmts --enable` answers "not in database"

# the exact line Debian's qemu-user-binfmt 1:10.0.2+ds-2+deb13u1~bpo12+1 ships in /usr/lib/binfmt.d/qemu-aarch64.conf
QEMU10_AARCH64 = (
    r":qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:"
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:"
    r"/usr/libexec/qemu-binfmt/aarch64-binfmt-P:OPF"
)


class FakeKernel:
    """A binfmt_misc tree whose `register` file behaves like the kernel's: a written rule
    becomes an entry (`enabled`, interpreter, flags); a name already registered is refused."""

    def __init__(self, root, mounted=True):
        self.root, self.lines = root, []
        if mounted:
            self.mount()

    def mount(self):
        (self.root / "status").write_text("enabled\n")

    def write(self, path, text):
        if path.name == "register":
            rule = emulation.parse_binfmt_line(text, path)
            if (self.root / rule.name).exists():
                raise OSError(17, "File exists")
            self.lines.append(text.strip())
            (self.root / rule.name).write_text(
                f"enabled\ninterpreter {rule.interpreter}\nflags: {rule.flags}\noffset 0\nmagic 7f454c46\n"
            )
        else:  # "-1" to an entry: remove the handler
            path.unlink()


@pytest.fixture
def qemu10(tmp_path, monkeypatch):
    """An amd64 root host, no systemd (as in a CI container), binfmt_misc mounted but empty,
    qemu 10's binfmt.d rule installed, and binfmt-support that has never heard of it."""
    kernel = FakeKernel(tmp_path / "binfmt_misc" if (tmp_path / "binfmt_misc").mkdir() is None else None)
    binfmt_d = tmp_path / "usr-lib-binfmt.d"
    binfmt_d.mkdir()
    interp = tmp_path / "aarch64-binfmt-P"
    interp.write_text("")
    (binfmt_d / "qemu-aarch64.conf").write_text(
        QEMU10_AARCH64.replace("/usr/libexec/qemu-binfmt/aarch64-binfmt-P", str(interp)) + "\n"
    )
    (binfmt_d / "python3.11.conf").write_text(":python3.11:M::\\xa7\\x0d\\x0d\\x0a::/usr/bin/python3.11:\n")
    monkeypatch.setattr(emulation, "BINFMT", kernel.root)
    monkeypatch.setattr(emulation, "BINFMT_D", (tmp_path / "etc-binfmt.d", binfmt_d))
    monkeypatch.setattr(emulation, "SYSTEMD_RUNNING", tmp_path / "no-systemd")
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    monkeypatch.setattr(emulation.os, "geteuid", lambda: 0)
    calls = []

    def run(argv):
        calls.append(argv)
        if argv[-2:] == ["--display", "qemu-aarch64"] or argv[-2:] == ["--enable", "qemu-aarch64"]:
            return subprocess.CompletedProcess(
                argv, 2, "", "update-binfmts: warning: qemu-aarch64 not in database of installed binary formats.\n"
            )
        raise AssertionError(f"unexpected command {argv}")

    monkeypatch.setattr(emulation, "_run", run)
    monkeypatch.setattr(emulation.shutil, "which", lambda name, path=None: f"/usr/sbin/{name}")
    real_write = Path.write_text

    def write_text(self, text, *a, **kw):
        if self.parent == kernel.root and (self.name == "register" or text.strip() == "-1"):
            return kernel.write(self, text)
        return real_write(self, text, *a, **kw)

    monkeypatch.setattr(Path, "write_text", write_text)
    kernel.calls, kernel.interp, kernel.binfmt_d = calls, interp, binfmt_d
    return kernel


def test_qemu10s_binfmt_d_rule_is_parsed_as_the_kernel_reads_it():
    rule = emulation.parse_binfmt_line(QEMU10_AARCH64, Path("/usr/lib/binfmt.d/qemu-aarch64.conf"))
    assert (rule.name, rule.interpreter, rule.flags) == (
        "qemu-aarch64",
        "/usr/libexec/qemu-binfmt/aarch64-binfmt-P",
        "OPF",
    )
    assert emulation.parse_binfmt_line("# comment", Path("x")) is None


def test_qemu10_without_binfmt_support_entry_is_registered_from_its_binfmt_d_file(qemu10):
    """The bug of issue 37: update-binfmts says "not in database", the old code gave up."""
    log = []
    got = emulation.ensure({"arm64"}, log.append)
    assert qemu10.lines == [QEMU10_AARCH64.replace("/usr/libexec/qemu-binfmt/aarch64-binfmt-P", str(qemu10.interp))]
    assert got["arm64"].startswith("emulated (qemu-aarch64 via") and "flags OPF" in got["arm64"]
    assert f"{qemu10.binfmt_d / 'qemu-aarch64.conf'}, written to {qemu10.root / 'register'}" in log[0]
    assert not any("update-binfmts" in a[0] for a in qemu10.calls)


def test_where_systemd_runs_systemd_binfmt_registers_the_file(qemu10, monkeypatch, tmp_path):
    (tmp_path / "systemd").mkdir()
    monkeypatch.setattr(emulation, "SYSTEMD_RUNNING", tmp_path / "systemd")
    monkeypatch.setattr(emulation, "_systemd_binfmt", lambda: "/usr/lib/systemd/systemd-binfmt")
    conf = qemu10.binfmt_d / "qemu-aarch64.conf"

    def run(argv):
        qemu10.calls.append(argv)
        assert argv == ["/usr/lib/systemd/systemd-binfmt", str(conf)]
        qemu10.write(qemu10.root / "register", conf.read_text())
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(emulation, "_run", run)
    log = []
    emulation.ensure({"arm64"}, log.append)
    assert f"(systemd-binfmt {conf})" in log[0]


def test_a_rule_in_etc_binfmt_d_overrides_the_packaged_one(qemu10, tmp_path):
    etc = tmp_path / "etc-binfmt.d"
    etc.mkdir()
    (etc / "qemu-aarch64.conf").write_text("# disabled by the admin\n")
    assert emulation.binfmt_d_rule("qemu-aarch64") is None


def test_an_old_handler_without_the_fix_binary_flag_is_replaced(qemu10):
    handler(qemu10.root, flags="P")
    emulation.ensure({"arm64"}, lambda s: None)
    assert emulation.handler_state("arm64")[0] and "OPF" in (qemu10.root / "qemu-aarch64").read_text()


def test_a_rule_without_f_gets_it_because_containers_need_it(qemu10):
    conf = qemu10.binfmt_d / "qemu-aarch64.conf"
    conf.write_text(conf.read_text().replace(":OPF", ":OP"))
    log = []
    emulation.ensure({"arm64"}, log.append)
    assert qemu10.lines[0].endswith(":OPF") and "with the F flag added" in log[0]


def test_binfmt_support_is_used_where_that_is_what_is_installed(qemu10, monkeypatch):
    (qemu10.binfmt_d / "qemu-aarch64.conf").unlink()

    def run(argv):
        qemu10.calls.append(argv)
        if argv[-1] == "qemu-aarch64" and argv[-2] == "--enable":
            handler(qemu10.root)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(emulation, "_run", run)
    log = []
    emulation.ensure({"arm64"}, log.append)
    assert "binfmt-support: update-binfmts --enable qemu-aarch64" in log[0]


@pytest.mark.parametrize(
    "situation, cause, fix, not_in_fix",
    [
        ("not root", "needs root", "run this build as root once", "setup.sh"),
        ("no binfmt_misc", "binfmt_misc is not available", "register the handler on the host", "setup.sh"),
        ("no qemu", "qemu's user-mode emulator is not installed", "scripts/setup.sh", None),
    ],
)
def test_each_cause_gets_its_own_fix_and_the_way_to_leave_the_cells_out(
    qemu10, monkeypatch, situation, cause, fix, not_in_fix
):
    if situation == "not root":
        monkeypatch.setattr(emulation.os, "geteuid", lambda: 1000)
    elif situation == "no binfmt_misc":
        (qemu10.root / "status").unlink()
        monkeypatch.setattr(
            emulation.subprocess,
            "run",
            lambda *a, **kw: subprocess.CompletedProcess(
                a[0], 32, "", "mount: /proc/sys/fs/binfmt_misc: permission denied."
            ),
        )
    else:
        (qemu10.binfmt_d / "qemu-aarch64.conf").unlink()
    with pytest.raises(emulation.EmulationError) as e:
        emulation.ensure({"arm64"}, lambda s: None)
    assert cause in e.value.cause and fix in e.value.fix
    assert "--select platform=linux/amd64" in e.value.fix
    if not_in_fix:
        # the user ran setup.sh and is root: a fix naming setup.sh again is not a fix
        assert not_in_fix not in e.value.fix


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/lib/binfmt.d/qemu-aarch64.conf").exists() or platform.machine() != "x86_64",
    reason="needs root on an x86_64 host with qemu's binfmt.d rule (scripts/setup.sh installs it)",
)
def test_the_real_kernel_handler_is_removed_and_registered_again():
    """On the real kernel: no aarch64 handler (as on a fresh machine), then the build's
    registration, then the kernel says the handler is enabled with F. Leaves it registered."""
    real = Path("/proc/sys/fs/binfmt_misc")
    if not (real / "status").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(real)], check=False)
    if not (real / "status").exists():
        pytest.skip("binfmt_misc cannot be mounted here")
    if (real / "qemu-aarch64").exists():
        (real / "qemu-aarch64").write_text("-1\n")
    assert not emulation.handler_state("arm64")[0]
    log = []
    emulation.ensure({"arm64"}, log.append)
    ok, what = emulation.handler_state("arm64")
    assert ok and "F" in what.rsplit("flags", 1)[1], what
    assert "registered the qemu-aarch64 binfmt handler" in log[0]


def test_each_architecture_has_its_own_bootstrap_name(monkeypatch):
    monkeypatch.setattr(emulation, "host_arch", lambda: "amd64")
    assert bootstrap.bootstrap_ref("debian:12.15-slim") == "trainbase-bootstrap/debian:12.15-slim"
    assert bootstrap.bootstrap_ref("debian:12.15-slim", "amd64") == "trainbase-bootstrap/debian:12.15-slim"
    assert bootstrap.bootstrap_ref("debian:12.15-slim", "arm64") == "trainbase-bootstrap/arm64/debian:12.15-slim"


def test_another_platforms_lock_accepts_every_older_manylinux():
    tags = pip_locks.platform_tags("manylinux_2_35_aarch64")
    assert (
        tags[0] == "manylinux_2_35_aarch64" and "manylinux_2_17_aarch64" in tags and tags[-1] == "manylinux2014_aarch64"
    )
    ls = pip_locks.LockSet("x-arm64", "3.11", ("a==1",), (), "manylinux_2_35_aarch64")
    assert ls.inputs_sha256 != pip_locks.LockSet("x", "3.11", ("a==1",)).inputs_sha256
    assert "# platform: manylinux_2_35_aarch64" in pip_locks.header(ls)


def test_an_emulated_arm64_container_runs_as_a_gpu_servers_cpu_not_qemus_512_bit_max(monkeypatch):
    """qemu's default CPU has 512-bit SVE, which no GPU server has: every container of an
    emulated image is started as the first CPU of EMULATED_CPUS (Grace), unless told another;
    a native image gets no QEMU_CPU at all."""
    from trainbase_common import engine
    from trainbase_conformance import containers
    from trainbase_conformance import emulation as conf_emulation

    monkeypatch.setattr(conf_emulation, "host_arch", lambda: "amd64")
    started = []
    monkeypatch.setattr(containers.engine, "run_detached", lambda image, cmd, **kw: started.append(kw["opts"]) or "cid")
    arch = {}
    monkeypatch.setattr(containers, "inspect_image", lambda ref: {"Architecture": arch[ref], "Os": "linux"})
    arch.update({"img-arm64": "arm64", "img-amd64": "amd64"})

    assert conf_emulation.emulated_cpus({"Architecture": "amd64"}) == ()
    cpus = conf_emulation.emulated_cpus({"Architecture": "arm64"})
    assert [m for _, m in cpus] == ["neoverse-n2", "neoverse-v1"]

    containers.Container.start("img-arm64", engine.RunOptions())
    containers.Container.start("img-amd64", engine.RunOptions())
    containers.Container.start("img-arm64", engine.RunOptions(env=(("QEMU_CPU", "neoverse-v1"),)))
    assert [dict(o.env).get("QEMU_CPU") for o in started] == ["neoverse-n2", None, "neoverse-v1"]
    assert "-e QEMU_CPU=neoverse-n2" in started[0].describe()
