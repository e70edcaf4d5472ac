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

USER = "tbconf-rt"  # a user of our own: uid 1000 may be someone real on the host
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
    p = subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/sh", "--comment", "trainbase runtime tier", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if p.returncode != 0:
        raise RuntimeUnavailable(f"useradd {name}: {p.stderr.strip()}")
    return pwd.getpwnam(name)


def as_user(
    user: str, argv: list[str], env: dict[str, str] | None = None, timeout: int = 300, cwd: str = "/"
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` with exactly the environment a login of theirs starts with
    (HOME, USER, LOGNAME, the ordinary PATH) plus ``env``: nothing of root's environment."""
    pw = pwd.getpwnam(user)
    base = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    full = {**base, **(env or {})}
    cmd = [_runuser(), "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in full.items()], *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)


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
    # the unprivileged runtime's user reads the unpacked image: 0755 like ch-convert leaves it
    os.chmod(tmp.parent, 0o755)  # noqa: S103
    os.chmod(tmp, 0o755)  # noqa: S103
    # GNU tar, not tarfile: it keeps device nodes, hard links and modes as root the way
    # ch-convert's unpacking does, at the speed of the disk
    tar = subprocess.Popen(["tar", "-x", "-C", str(tmp), "--numeric-owner", "-f", "-"], stdin=subprocess.PIPE)
    assert tar.stdin is not None  # stdin=PIPE
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


# ----------------------------------------------------------------------------- rootless Podman

# Debian's Podman 4.3 picks the vfs driver for a rootless user without a storage.conf: every
# layer a full copy (the 2.4 GB Open MPI 5 image: 63 s to load, against 34 s on overlay, which
# this kernel offers unprivileged). HPC sites ship the same file (podman-hpc, NERSC).
PODMAN_STORAGE_CONF = '[storage]\ndriver = "overlay"\n'


def podman_missing() -> str | None:
    for tool, package in (("podman", "podman"), ("newuidmap", "uidmap")):
        if not shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"):
            return f"{tool} not found (Debian: apt-get install {package}; scripts/setup.sh does)"
    return None


def _subids(user: str) -> None:
    """Rootless Podman maps the container's uids onto the user's /etc/subuid and /etc/subgid
    ranges; useradd adds them on Debian, an older user may lack them."""
    for f, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        lines = Path(f).read_text().splitlines() if Path(f).exists() else []
        if any(ln.split(":", 1)[0] == user for ln in lines):
            continue
        taken = [int(a) + int(n) for ln in lines if ln.count(":") == 2 for _, a, n in [ln.split(":")]]
        start = max([100000, *taken])
        p = subprocess.run(
            ["usermod", flag, f"{start}-{start + 65535}", user], capture_output=True, text=True, check=False
        )
        if p.returncode != 0:
            raise RuntimeUnavailable(f"usermod {flag} for {user}: {p.stderr.strip()}")


def podman_ready(user: str) -> pwd.struct_passwd:
    """``user`` can run rootless Podman: the tools, subordinate ids, overlay storage."""
    if why := podman_missing():
        raise RuntimeUnavailable(why)
    _subids(user)
    pw = pwd.getpwnam(user)
    conf = Path(pw.pw_dir, ".config", "containers", "storage.conf")
    if not conf.exists():
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(PODMAN_STORAGE_CONF)
        for d in (conf.parent.parent, conf.parent, conf):
            os.chown(d, pw.pw_uid, pw.pw_gid)
    return pw


def podman_load(user: str, image: str) -> str:
    """``image`` from the Docker engine into ``user``'s rootless Podman store (`docker save |
    podman load`, what a user without a registry does); returns the name Podman gives it."""
    pw = podman_ready(user)
    pw_env = {"HOME": pw.pw_dir, "USER": user, "LOGNAME": user, "PATH": "/usr/local/bin:/usr/bin:/bin"}
    load = subprocess.Popen(
        [_runuser(), "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in pw_env.items()], "podman", "load"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
    )
    assert load.stdin is not None and load.stdout is not None  # stdin=PIPE, stdout=PIPE
    try:
        shutil.copyfileobj(engine.save(image), load.stdin, 1 << 20)
    finally:
        load.stdin.close()
        out = load.stdout.read().decode(errors="replace")
        load.wait()
    names = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Loaded image")]
    if load.returncode != 0 or not names:
        raise RuntimeError(f"podman load of {image} as {user} exited {load.returncode}: {out.strip()[-800:]}")
    return names[0]


def podman_oci_runtime(unified: Path = Path("/sys/fs/cgroup/unified")) -> list[str]:
    """`--runtime runc` on a hybrid cgroup host whose cgroup2 part holds a controller (here:
    hugetlb, which no v1 hierarchy mounts): Podman's default crun refuses every container there
    ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"), runc runs
    them. Anywhere else (pure v1, pure v2): Podman's own choice."""
    try:
        controllers = (unified / "cgroup.controllers").read_text().split()
    except OSError:
        return []
    return ["--runtime", "runc"] if controllers and shutil.which("runc") else []


def podman_run(
    user: str, ref: str, args: list[str], command: str, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` as ``user``. `--network=host`: rootless networking (slirp4netns) adds
    nothing a single-container job needs; --shm-size as the suite's Docker runs (64 MB default
    is too small for 2 ranks' shared-memory transport)."""
    return as_user(
        user,
        [
            "podman",
            "run",
            "--rm",
            *podman_oci_runtime(),
            "--network=host",
            "--shm-size=1g",
            *args,
            ref,
            "sh",
            "-c",
            command,
        ],
        timeout=timeout,
    )


def podman_remove(user: str, ref: str) -> None:
    """Drops the image and stops the user's Podman pause process: nothing is left running."""
    as_user(user, ["podman", "rmi", "--force", ref], timeout=300)
    as_user(user, ["podman", "system", "migrate"], timeout=120)  # ends the rootless pause process


# ----------------------------------------------------------------------------- Apptainer, enroot
# Neither is packaged in Debian 12 (Apptainer ships .deb/.rpm releases, enroot NVIDIA's .deb), so
# their cases run where a runner has them (`-m apptainer`, `-m enroot`) and skip here, saying so.


def _convert_as_root(tool: str, package: str, args: list[str], out: Path) -> Path:
    """Run ``tool ARGS`` as root (it reads the Docker socket) to write ``out`` in its folder,
    then make both readable by everyone (the runtime user runs it)."""
    exe = shutil.which(tool)
    if not exe:
        raise RuntimeUnavailable(f"{tool} not installed (not packaged in Debian 12: {package})")
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=1800, cwd=out.parent, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    os.chmod(out.parent, 0o755)  # noqa: S103 -- the runtime's unprivileged user reads the converted image
    os.chmod(out, 0o644)
    return out


def apptainer_sif(image: str, dest: Path) -> Path:
    """``image`` converted the way users convert a local image: `apptainer build SIF
    docker-daemon:IMAGE`."""
    sif = dest / "image.sif"
    return _convert_as_root(
        "apptainer", "the Apptainer release .deb", ["build", "--force", str(sif), f"docker-daemon:{image}"], sif
    )


def enroot_squashfs(image: str, dest: Path) -> Path:
    """``image`` imported as pyxis does before its first task (`enroot import dockerd://IMAGE`)."""
    sqsh = dest / "image.sqsh"
    return _convert_as_root(
        "enroot", "NVIDIA's enroot .deb", ["import", "--output", str(sqsh), f"dockerd://{image}"], sqsh
    )
