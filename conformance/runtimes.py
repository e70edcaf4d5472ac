"""The host side of the runtime tier: an unprivileged host user (HPC sites run images as the
user's own uid) and an image unpacked into a directory for Charliecloud's `ch-run` (what
`ch-convert -i docker IMAGE DIR` makes: the image's filesystem plus `/ch/environment`, its ENV).

Why the tier unpacks with `docker export` instead of calling `ch-convert`: Charliecloud 0.31's
docker -> dir conversion gzips the whole export and unpacks it again, 3 min 45 s for the 2.8 GB
Open MPI 4 image on 2 cores against 15 s for the export itself; the result is the same tree and
the same `/ch/environment` (one `NAME=value` line per ENV entry, no quoting), which is what
`ch-run --set-env` reads."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from trainbase_common import engine

USER = "tbconf-rt"          # a user of our own: uid 1000 may be someone real on the host
UNPACK_ROOT = Path(os.environ.get("TRAINBASE_RUNTIME_DIR", "/var/tmp/trainbase-runtime"))


class RuntimeUnavailable(RuntimeError):
    """What a runtime needs is not on this host (the message names the package)."""


def _runuser() -> str:
    found = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not found:
        raise RuntimeUnavailable("runuser not found (util-linux)")
    return found


def ensure_user(name: str = USER) -> pwd.struct_passwd:
    """The unprivileged host user, created (with a home: ch-run and Podman want $HOME) when
    missing. Needs root; raises RuntimeUnavailable otherwise."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if os.geteuid() != 0:
        raise RuntimeUnavailable(f"creating the test user {name} needs root")
    p = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--comment", "trainbase runtime tier",
                        name], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeUnavailable(f"useradd {name}: {p.stderr.strip()}")
    return pwd.getpwnam(name)


def as_user(user: str, argv: list[str], env: dict[str, str] | None = None, timeout: int = 300,
            cwd: str = "/") -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` with exactly the environment a login of theirs starts with
    (HOME, USER, LOGNAME, the ordinary PATH) plus ``env``: nothing of root's environment."""
    pw = pwd.getpwnam(user)
    base = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8"}
    full = {**base, **(env or {})}
    cmd = [_runuser(), "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in full.items()], *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def unpack(image: str, dest: Path | None = None) -> Path:
    """The image's filesystem under ``dest`` with /ch/environment, as ch-convert writes it.
    Readable by others exactly as far as the image's own modes allow (nothing is chmod-ed: an
    image whose files only root can read must fail the tier, not be repaired by it)."""
    if not shutil.which("ch-run"):
        raise RuntimeUnavailable("ch-run not found (Debian: apt-get install charliecloud; scripts/setup.sh does)")
    info = engine.inspect_image(image)
    if info is None:
        raise RuntimeError(f"image {image} is not in the engine")
    dest = dest or UNPACK_ROOT / info.id.removeprefix("sha256:")[:12]
    if (dest / "ch" / "environment").exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    os.chmod(tmp.parent, 0o755)
    os.chmod(tmp, 0o755)
    # GNU tar, not tarfile: it keeps device nodes, hard links and modes as root the way
    # ch-convert's unpacking does, at the speed of the disk
    tar = subprocess.Popen(["tar", "-x", "-C", str(tmp), "--numeric-owner", "-f", "-"], stdin=subprocess.PIPE)
    try:
        engine.export_filesystem(image, tar.stdin)
    finally:
        tar.stdin.close()
        if tar.wait() != 0:
            raise RuntimeError(f"unpacking {image} into {tmp}: tar exited {tar.returncode}")
    (tmp / "ch").mkdir(exist_ok=True)
    (tmp / "ch" / "environment").write_text("".join(f"{e}\n" for e in info.raw["Config"].get("Env") or []))
    os.chmod(tmp / "ch" / "environment", 0o644)
    tmp.rename(dest)
    return dest


def remove_unpacked(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
