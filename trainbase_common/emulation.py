"""Running another architecture's images on this host: qemu user-mode emulation through the
kernel's binfmt_misc. BuildKit and every container runtime then execute arm64 binaries
transparently -- provided the handler is registered with the F (fix-binary) flag, which opens
the interpreter once at registration so it works inside containers whose root filesystem has no
qemu of its own.

The handler is registered only when something is about to execute a foreign image's binaries:
a build of such a cell, the supply documents of a cached one (made in a container of it), or a
tier of the suite run on it -- the handlers live in the kernel and are gone after every reboot,
while the images stay in the engine. A host where it cannot be registered skips those cells or
checks before anything starts, naming the cause and a fix that fits it, instead of an "exec
format error" in the first RUN line an hour in or an engine error at a container's first exec.

Where the handler's rule comes from depends on how qemu was packaged:
- qemu >= 9 on Debian (bookworm-backports' qemu 10, trixie) ships systemd ``binfmt.d`` files
  (``/usr/lib/binfmt.d/qemu-aarch64.conf``) and no longer enters them in binfmt-support's
  database, so ``update-binfmts --enable qemu-aarch64`` answers "not in database". The rule is
  read from the binfmt.d file and handed to ``systemd-binfmt`` where systemd runs (it owns the
  handlers there), else written to the kernel's ``register`` file -- what systemd-binfmt does.
- older packages (Debian 12's qemu 7.2, Ubuntu 22.04) enter it in binfmt-support's database:
  ``update-binfmts --enable``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .platforms import host_arch

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# systemd's binfmt.d search path, highest precedence first (binfmt.d(5)): a file of the same
# name in an earlier folder overrides the packaged one.
BINFMT_D = (
    Path("/etc/binfmt.d"),
    Path("/run/binfmt.d"),
    Path("/usr/local/lib/binfmt.d"),
    Path("/usr/lib/binfmt.d"),
    Path("/lib/binfmt.d"),
)
SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(3): present only when systemd is PID 1
# OCI architecture -> qemu's name for it (MACHINES: -> uname -m)
QEMU = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}
SBIN = "/usr/local/sbin:/usr/sbin:/sbin:" + os.environ.get("PATH", "")


class EmulationError(RuntimeError):
    """A foreign-architecture cell cannot run on this host. ``cause`` says why, ``fix`` what
    to do about it -- chosen for that cause, never a step the user has already taken. Shared by
    the build (a cell to build, or a cached one whose documents are made in a container) and the
    suite (a tier run on such an image), so both register the handler the same way."""

    def __init__(self, arch: str, cause: str, fix: str):
        self.arch, self.cause, self.fix = arch, cause, fix
        super().__init__(f"this {host_arch()} host cannot run {arch} binaries: {cause}. Fix: {fix}")


@dataclass(frozen=True)
class BinfmtRule:
    """One line of a binfmt.d file: ``:name:type:offset:magic:mask:interpreter:flags``."""

    name: str
    interpreter: str
    flags: str
    line: str
    source: Path


@dataclass(frozen=True)
class Unregistrable:
    """Why a handler could not be registered, and the fix for that cause."""

    cause: str
    fix: str


def is_native(arch: str) -> bool:
    return arch == host_arch()


def handler_state(arch: str) -> tuple[bool, str]:
    """(usable, what was found) for the binfmt handler of ``arch``."""
    name = QEMU.get(arch)
    if name is None:
        return False, f"no known emulator for {arch}"
    entry = BINFMT / name
    if not (BINFMT / "status").exists():
        return False, f"binfmt_misc is not mounted at {BINFMT}"
    if not entry.exists():
        return False, f"no {name} handler registered in {BINFMT}"
    text = entry.read_text()
    if not text.startswith("enabled"):
        return False, f"the {name} handler is registered but disabled"
    flags = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("flags:")), "")
    if "F" not in flags:
        # without F the kernel looks the interpreter up inside the container: "no such file"
        return False, f"the {name} handler lacks the F flag (flags: {flags or 'none'}): containers cannot use it"
    interp = next((ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith("interpreter ")), "?")
    return True, f"{name} via {interp} (flags {flags})"


def parse_binfmt_line(line: str, source: Path) -> BinfmtRule | None:
    """A binfmt.d rule, or None for a comment or blank line. The first character is the field
    separator (usually ':'); the kernel's register format, which binfmt.d files hold verbatim."""
    line = line.strip()
    if not line or line[0] in "#;":
        return None
    fields = line[1:].split(line[0])
    if len(fields) < 6:
        raise EmulationError("?", f"{source}: not a binfmt_misc rule: {line[:80]!r}", "reinstall qemu-user-static")
    return BinfmtRule(
        name=fields[0], interpreter=fields[5], flags=fields[6] if len(fields) > 6 else "", line=line, source=source
    )


def binfmt_d_rule(name: str, dirs: tuple[Path, ...] | None = None) -> BinfmtRule | None:
    """The rule named ``name`` in the binfmt.d folders, honouring their precedence: a file in
    /etc/binfmt.d overrides the packaged /usr/lib/binfmt.d one of the same file name."""
    seen: set[str] = set()
    for d in BINFMT_D if dirs is None else dirs:
        for f in sorted(d.glob("*.conf")) if d.is_dir() else ():
            if f.name in seen:
                continue
            seen.add(f.name)
            for raw in f.read_text(errors="replace").splitlines():
                rule = parse_binfmt_line(raw, f)
                if rule is not None and rule.name == name:
                    return rule
    return None


def ensure(arches: set[str], log: Callable[[str], object]) -> dict[str, str]:
    """Make every foreign architecture in ``arches`` runnable here; returns arch -> how. Raises
    EmulationError (its cause and its fix) when one cannot be."""
    done: dict[str, str] = {}
    for arch in sorted(arches):
        if is_native(arch):
            done[arch] = "native"
            continue
        ok, what = handler_state(arch)
        if not ok:
            outcome = _register(arch)
            if isinstance(outcome, Unregistrable):
                raise EmulationError(arch, f"{what}, and it cannot be registered: {outcome.cause}", outcome.fix)
            ok, now = handler_state(arch)
            if not ok:
                raise EmulationError(
                    arch,
                    f"{what}; registering it ({outcome}) left: {now}",
                    f"check `cat {BINFMT / QEMU[arch]}` and the kernel log (dmesg)",
                )
            log(
                f"emulation: registered the {QEMU[arch]} binfmt handler ({outcome}), because {arch} binaries are "
                f"about to run (a build, a cached image's supply documents, or the suite's checks): {now}"
            )
            what = now
        else:
            log(f"emulation: {arch} cells run under {what}")
        done[arch] = f"emulated ({what})"
    return done


def _leave_out(arch: str) -> str:
    return (
        f"or leave the {arch} cells out: --select platform=linux/{host_arch()}; or build them on a native {arch} runner"
    )


def _register(arch: str) -> str | Unregistrable:
    """Register (or re-register) the qemu handler of ``arch``. Returns how it was done, or
    why it cannot be and what fixes that."""
    name = QEMU[arch]
    if os.geteuid() != 0:
        rule = binfmt_d_rule(name)
        how = (
            f"`sudo {_systemd_binfmt() or 'systemd-binfmt'} {rule.source}`"
            if rule and _systemd_runs()
            else f"as root: `grep '^:{name}:' {rule.source} > {BINFMT}/register`"
            if rule
            else f"as root: `update-binfmts --enable {name}`"
        )
        return Unregistrable(
            "registering a binfmt handler needs root",
            f"run this build as root once (the handler then stays until reboot), or register it: "
            f"{how}; {_leave_out(arch)}",
        )
    if not (BINFMT / "status").exists():
        r = subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True, check=False
        )
        if r.returncode != 0 or not (BINFMT / "status").exists():
            return Unregistrable(
                f"binfmt_misc is not available at {BINFMT} (mount: "
                f"{(r.stderr or r.stdout).strip()[:160] or 'no effect'})",
                "binfmt_misc belongs to the kernel: inside a container, register the handler on the "
                f"host that runs it (`modprobe binfmt_misc`, then register {name} there); " + _leave_out(arch),
            )
    rule = binfmt_d_rule(name)
    if rule is not None:
        return _register_rule(rule, arch)
    tool = shutil.which("update-binfmts", path=SBIN)
    if tool is not None and _run([tool, "--display", name]).returncode == 0:
        _remove_stale(name)
        r = _run([tool, "--enable", name])
        if r.returncode != 0:
            return Unregistrable(
                f"update-binfmts --enable {name} failed: {(r.stderr or r.stdout).strip()[:200]}",
                "re-install qemu-user-static (`apt-get install --reinstall qemu-user-static`); " + _leave_out(arch),
            )
        return f"binfmt-support: update-binfmts --enable {name}"
    return Unregistrable(
        f"qemu's user-mode emulator is not installed: no {name} rule in {', '.join(map(str, BINFMT_D[:4]))} "
        f"and none in binfmt-support's database",
        "install it: `bash scripts/setup.sh` (Debian 12: qemu-user-static from bookworm-backports; Debian 13 / "
        "Ubuntu: `apt-get install qemu-user-static`); " + _leave_out(arch),
    )


def _register_rule(rule: BinfmtRule, arch: str) -> str | Unregistrable:
    """Register a binfmt.d rule: by systemd-binfmt where systemd runs, else by writing the line
    to the kernel's register file. A rule without F gets it: containers need it (above)."""
    interp = Path(rule.interpreter)
    if not interp.exists():
        return Unregistrable(
            f"{rule.source} names {rule.interpreter}, which is missing",
            "re-install qemu-user-static (`apt-get install --reinstall qemu-user-static`); " + _leave_out(arch),
        )
    line = rule.line if "F" in rule.flags else _with_flag(rule, "F")
    _remove_stale(rule.name)
    tool = _systemd_binfmt()
    if line == rule.line and tool and _systemd_runs():
        r = _run([tool, str(rule.source)])
        if r.returncode == 0:
            return f"systemd-binfmt {rule.source}"
        # fall through: the kernel's register file is what systemd-binfmt writes to anyway
    try:
        (BINFMT / "register").write_text(line + "\n")
    except OSError as e:
        return Unregistrable(
            f"writing {rule.source}'s rule to {BINFMT / 'register'} failed: {e}",
            f"check the rule with `cat {rule.source}`; " + _leave_out(arch),
        )
    return f"{rule.source}{' with the F flag added' if line != rule.line else ''}, written to {BINFMT / 'register'}"


def _with_flag(rule: BinfmtRule, flag: str) -> str:
    sep = rule.line[0]
    fields = rule.line[1:].split(sep)
    while len(fields) < 7:
        fields.append("")
    fields[6] += flag
    return sep + sep.join(fields)


def _remove_stale(name: str) -> None:
    """A registered but unusable handler (disabled, no F flag, an old emulator kept open by
    F) blocks a new registration of the same name (EEXIST): remove it first."""
    entry = BINFMT / name
    if entry.exists():
        entry.write_text("-1\n")


def _systemd_runs() -> bool:
    return SYSTEMD_RUNNING.is_dir()


def _systemd_binfmt() -> str | None:
    for p in ("/usr/lib/systemd/systemd-binfmt", "/lib/systemd/systemd-binfmt"):
        if os.access(p, os.X_OK):
            return p
    return shutil.which("systemd-binfmt", path=SBIN)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)
