"""Running another architecture's images on this host: qemu user-mode emulation through the
kernel's binfmt_misc. BuildKit and every container runtime then execute arm64 binaries
transparently -- provided the handler is registered with the F (fix-binary) flag, which opens
the interpreter once at registration so it works inside containers whose root filesystem has no
qemu of its own.

The handler is registered only when a build selects a cell of a foreign platform (and the log
says so); a host where it cannot be registered stops that build before anything starts, naming
the fix, instead of an "exec format error" in the first RUN line an hour in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from trainbase_common.platforms import host_arch

from ..errors import TrainbaseError

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# OCI architecture -> qemu's name for it (MACHINES: -> uname -m)
QEMU = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}
SBIN = "/usr/local/sbin:/usr/sbin:/sbin:" + os.environ.get("PATH", "")


class EmulationError(TrainbaseError):
    """A foreign-architecture cell cannot run on this host; the message says how to fix it."""


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


def ensure(arches: set[str], log: Callable[[str], None]) -> dict[str, str]:
    """Make every foreign architecture in ``arches`` runnable here; returns arch -> how. Raises
    EmulationError naming the fix when one cannot be."""
    done: dict[str, str] = {}
    for arch in sorted(arches):
        if is_native(arch):
            done[arch] = "native"
            continue
        ok, what = handler_state(arch)
        if not ok:
            why = _register(arch)
            ok, what = handler_state(arch)
            if not ok:
                raise EmulationError(
                    f"{arch} cells are selected, but this {host_arch()} host cannot run {arch} binaries: {what}"
                    + (f" ({why})" if why else "")
                    + ". Run `bash scripts/setup.sh` (installs qemu-user-static and binfmt-support) as root, "
                    "or build these cells on a native runner")
            log(f"emulation: registered the {QEMU[arch]} binfmt handler, because {arch} cells are selected: {what}")
        else:
            log(f"emulation: {arch} cells run under {what}")
        done[arch] = f"emulated ({what})"
    return done


def _register(arch: str) -> str | None:
    """Mount binfmt_misc and enable Debian's qemu-user-static handler. None on success, else why not."""
    if os.geteuid() != 0:
        return "registering a handler needs root"
    tool = shutil.which("update-binfmts", path=SBIN)
    if tool is None:
        return "update-binfmts not found: binfmt-support is not installed"
    if not (BINFMT / "status").exists():
        r = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True)
        if r.returncode != 0:
            return f"mounting binfmt_misc failed: {r.stderr.strip()[:200]}"
    r = subprocess.run([tool, "--enable", QEMU[arch]], capture_output=True, text=True)
    if r.returncode != 0:
        return f"update-binfmts --enable {QEMU[arch]} failed: {(r.stderr or r.stdout).strip()[:200]}"
    return None
