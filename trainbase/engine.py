"""Host and container-engine set-up for trainbase.

Standard library only: everything goes through the docker CLI and a few host
tools (apt-get, dockerd, debootstrap, tar) via ``subprocess``.

* :func:`docker_cli` picks a docker client that can run BuildKit builds
  (``DOCKER_BUILDKIT=1 docker build`` with ``--secret`` and cache mounts).
* :func:`ensure_engine` makes sure an engine answers, installing ``docker.io``
  and starting ``dockerd`` on a fresh Debian/Ubuntu machine when needed.
* :func:`ensure_base_image` makes a base image such as ``debian:12-slim``
  available locally: present, pulled, or bootstrapped from the Debian mirror
  with debootstrap and imported under exactly the same reference, so that the
  same ``FROM`` line builds here and in production.

Command line::

    python -m trainbase.engine ensure
    python -m trainbase.engine base REF [SUITE] [--mirror URL]
    python -m trainbase.engine cli        # prints the chosen docker client
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "EngineError",
    "docker_cli",
    "engine_available",
    "ensure_base_image",
    "ensure_engine",
    "image_exists",
    "try_pull",
]

Log = Callable[[str], None]

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
DOCKERD_LOG = "/var/log/trainbase-dockerd.log"
DOCKERD_PIDFILE = "/var/run/docker.pid"
DOCKERD_START_TIMEOUT = 60.0
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")

# Client versions where `DOCKER_BUILDKIT=1 docker build` uses the engine's
# BuildKit directly (no buildx plugin needed) and `RUN --mount` works without a
# `# syntax=` line.  From client 23 on, that path requires the buildx plugin.
CLASSIC_BUILDKIT_MIN = (20, 10)
CLASSIC_BUILDKIT_MAX = (23, 0)  # exclusive

# Debian suites debootstrap can build from a Debian mirror, by codename/alias.
DEBIAN_SUITES = frozenset({
    "buster", "bullseye", "bookworm", "trixie", "forky", "duke",
    "sid", "unstable", "experimental", "testing", "stable",
    "oldstable", "oldoldstable",
})
# Ubuntu codenames: never bootstrappable here (Ubuntu's archive is not used).
UBUNTU_SUITES = frozenset({
    "trusty", "xenial", "bionic", "cosmic", "disco", "eoan", "focal", "groovy",
    "hirsute", "impish", "jammy", "kinetic", "lunar", "mantic", "noble",
    "oracular", "plucky", "questing", "resolute",
})

# Same path sets the official "-slim" Debian images exclude (dpkg path-exclude).
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
)
SLIM_INCLUDES = (
    "/usr/share/doc/*/copyright",
    "/usr/share/doc/kde/HTML/C/*",
    "/usr/share/gnome/help/*/C/*",
    "/usr/share/locale/all_languages",
    "/usr/share/locale/currency/*",
    "/usr/share/locale/l10n/*",
    "/usr/share/locale/languages",
    "/usr/share/locale/locale.alias",
    "/usr/share/omf/*/*-C.emf",
)


class EngineError(Exception):
    """The host or container engine is not in a usable state."""


# --------------------------------------------------------------------------
# subprocess helpers (tests monkeypatch ``subprocess.run`` in this module)
# --------------------------------------------------------------------------

def _run(cmd: Sequence[str], timeout: float | None = None,
         env: dict | None = None, input: str | None = None,
         ) -> subprocess.CompletedProcess:
    """Run ``cmd`` capturing text output; never raises for a missing binary
    or a timeout (returncode 127 / 124 instead)."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, check=False,
                              timeout=timeout, env=env, input=input)
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(list(cmd), 127, "", str(exc))
    except subprocess.TimeoutExpired as exc:
        def _s(x):
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
        return subprocess.CompletedProcess(
            list(cmd), 124, _s(exc.stdout),
            _s(exc.stderr) + f"\ntimed out after {timeout:g} s")
    except OSError as exc:
        return subprocess.CompletedProcess(list(cmd), 126, "", str(exc))


def _tail(text: str, n: int = 15) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


def _is_root() -> bool:
    return os.geteuid() == 0


def _sbin_path() -> str:
    """PATH with the sbin directories (dockerd, iptables, debootstrap live there)."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    for d in ("/usr/local/sbin", "/usr/sbin", "/sbin"):
        if d not in parts:
            parts.append(d)
    return os.pathsep.join(p for p in parts if p)


def _which(name: str) -> str | None:
    return shutil.which(name, path=_sbin_path())


def _os_release(path: str = "/etc/os-release") -> dict:
    info = {}
    try:
        for line in Path(path).read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                k, v = line.split("=", 1)
                info[k.strip()] = v.strip().strip('"').strip("'")
    except OSError:
        pass
    return info


def _is_debian_like() -> bool:
    info = _os_release()
    ids = {info.get("ID", "")} | set(info.get("ID_LIKE", "").split())
    return bool(ids & {"debian", "ubuntu"})


def _apt_install(packages: Sequence[str], log: Log, why: str) -> None:
    """``apt-get update && apt-get install -y PACKAGES`` (root, Debian/Ubuntu)."""
    pkgs = " ".join(packages)
    if not _is_root():
        raise EngineError(f"{why}: installing {pkgs} needs root; run scripts/setup.sh "
                          f"as root or `apt-get install -y {pkgs}` yourself")
    if not _which("apt-get") or not _is_debian_like():
        raise EngineError(f"{why}: this host is not Debian/Ubuntu (no apt-get); "
                          f"install {pkgs} with the system's package manager")
    # NEEDRESTART_SUSPEND: needrestart must not restart services (dockerd) from here
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", NEEDRESTART_SUSPEND="1",
               PATH=_sbin_path())
    log(f"apt-get update (to install {pkgs})")
    r = _run(["apt-get", "update"], env=env)
    if r.returncode != 0:
        raise EngineError(f"apt-get update failed (exit {r.returncode}):\n"
                          f"{_tail(r.stdout + r.stderr)}")
    log(f"apt-get install -y {pkgs}")
    r = _run(["apt-get", "install", "-y", *packages], env=env)
    if r.returncode != 0:
        raise EngineError(f"apt-get install -y {pkgs} failed (exit {r.returncode}):\n"
                          f"{_tail(r.stdout + r.stderr)}")


# --------------------------------------------------------------------------
# docker client selection
# --------------------------------------------------------------------------

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple | None:
    """First ``X.Y[.Z]`` in ``text`` as a tuple of ints, e.g.
    ``"Docker version 20.10.24+dfsg1, build 297e128"`` -> ``(20, 10, 24)``."""
    m = _VERSION_RE.search(text or "")
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _candidate_clients(path_env: str) -> list:
    """Every distinct ``docker`` executable on PATH (then the usual places),
    in PATH order; symlinked duplicates (/bin -> /usr/bin) are dropped."""
    dirs = [d for d in path_env.split(os.pathsep) if d]
    dirs += ["/usr/local/bin", "/usr/bin"]
    seen, out = set(), []
    for d in dirs:
        p = os.path.join(d, "docker")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            real = os.path.realpath(p)
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


def client_version(client: str) -> tuple | None:
    """The client's own version; never contacts the engine."""
    r = _run([client, "--version"], timeout=20)
    v = parse_version(r.stdout) if r.returncode == 0 else None
    if v is None:
        # `docker version` prints the client part even when no engine answers
        # (and then exits 1), so its stdout is parsed regardless of the code.
        r = _run([client, "version", "--format", "{{.Client.Version}}"], timeout=20)
        v = parse_version(r.stdout.splitlines()[0] if r.stdout.strip() else "")
    return v


def has_buildx(client: str) -> bool:
    return _run([client, "buildx", "version"], timeout=20).returncode == 0


def _fmt_version(v: tuple | None) -> str:
    return ".".join(map(str, v)) if v else "unknown version"


@functools.lru_cache(maxsize=8)
def _select_client(path_env: str, override: str) -> str:
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise EngineError(f"TRAINBASE_DOCKER={override} is not an executable file")
        return override
    clients = _candidate_clients(path_env)
    if not clients:
        raise EngineError("no docker client found on PATH: run scripts/setup.sh "
                          "(or `apt-get install -y docker.io`)")
    for c in clients:
        if has_buildx(c):
            return c
    notes = []
    for c in clients:
        v = client_version(c)
        if v is not None and CLASSIC_BUILDKIT_MIN <= v[:2] < CLASSIC_BUILDKIT_MAX:
            return c
        if v is not None and v[:2] >= CLASSIC_BUILDKIT_MAX:
            why = "needs the buildx plugin for BuildKit, and `docker buildx version` fails"
        elif v is not None:
            why = "too old for BuildKit cache/secret mounts"
        else:
            why = "version could not be read"
        notes.append(f"  {c} ({_fmt_version(v)}): {why}")
    raise EngineError(
        "no docker client can run BuildKit builds (DOCKER_BUILDKIT=1 docker build "
        "with --secret and RUN --mount):\n" + "\n".join(notes) +
        "\ninstall the buildx plugin (Debian 13: docker-buildx) or a 20.10-22.x client "
        "(Debian 12: docker.io), or point TRAINBASE_DOCKER at a suitable client")


def docker_cli() -> str:
    """Path of a docker client that can run BuildKit builds.

    Preference: ``$TRAINBASE_DOCKER`` if set; else the first client on PATH
    whose ``docker buildx version`` works; else the first whose version is in
    [20.10, 23) (classic ``DOCKER_BUILDKIT=1`` builder); else :class:`EngineError`.
    """
    return _select_client(os.environ.get("PATH", ""),
                          os.environ.get("TRAINBASE_DOCKER", ""))


def _client() -> str | None:
    """A docker client for non-build commands (info, inspect, pull, import):
    the build client if there is one, else any docker on PATH."""
    try:
        return docker_cli()
    except EngineError:
        clients = _candidate_clients(os.environ.get("PATH", ""))
        return clients[0] if clients else None


def _need_client() -> str:
    c = _client()
    if c is None:
        raise EngineError("no docker client found on PATH: run scripts/setup.sh")
    return c


# --------------------------------------------------------------------------
# engine
# --------------------------------------------------------------------------

def docker_host() -> str:
    return os.environ.get("DOCKER_HOST", "").strip()


def is_default_host(host: str | None = None) -> bool:
    """True when DOCKER_HOST is unset or names the default local socket."""
    host = docker_host() if host is None else host.strip()
    if not host:
        return True
    if host.startswith("unix://"):
        return os.path.normpath(host[len("unix://"):]) in DEFAULT_SOCKETS
    return False


def _info(timeout: float) -> subprocess.CompletedProcess | None:
    c = _client()
    if c is None:
        return None
    return _run([c, "info", "--format", "{{.ServerVersion}}"], timeout=timeout)


def engine_available(timeout: float = 5) -> bool:
    """True when ``docker info`` gets an answer from the engine (DOCKER_HOST
    is honoured: it is passed on to the client in the environment)."""
    r = _info(timeout)
    return r is not None and r.returncode == 0 and bool(r.stdout.strip())


def _server_version(timeout: float = 5) -> str:
    c = _client()
    if c is None:
        return "?"
    r = _run([c, "version", "--format", "{{.Server.Version}}"], timeout=timeout)
    return r.stdout.strip() or "?"


def _pid_alive(pidfile: str) -> int | None:
    try:
        pid = int(Path(pidfile).read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm.startswith("dockerd") else None


def _read_log_tail(path: str, offset: int = 0, n: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"    (could not read {path}: {exc})"
    return _tail(text, n) or "    (log is empty)"


def _wait_for_engine(timeout: float, proc: subprocess.Popen | None = None,
                     log_path: str = DOCKERD_LOG, log_offset: int = 0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if engine_available(timeout=3):
            return
        if proc is not None and proc.poll() is not None:
            raise EngineError(
                f"dockerd exited with code {proc.returncode} before answering; "
                f"last lines of {log_path}:\n{_read_log_tail(log_path, log_offset)}")
        if time.monotonic() >= deadline:
            pid = f" (pid {proc.pid} still running)" if proc is not None else ""
            raise EngineError(
                f"dockerd{pid} did not answer within {timeout:g} s; last lines of "
                f"{log_path}:\n{_read_log_tail(log_path, log_offset)}")
        time.sleep(0.5)


def _start_dockerd(dockerd: str, log: Log, timeout: float) -> None:
    Path(DOCKERD_LOG).parent.mkdir(parents=True, exist_ok=True)
    with open(DOCKERD_LOG, "ab") as logf:
        offset = logf.tell()
        log(f"starting {dockerd} in the background (log: {DOCKERD_LOG})")
        env = dict(os.environ, PATH=_sbin_path())
        env.pop("DOCKER_HOST", None)
        # start_new_session=True is setsid(): the daemon outlives this process
        # and its terminal.
        proc = subprocess.Popen([dockerd], stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)
    t0 = time.monotonic()
    _wait_for_engine(timeout, proc, DOCKERD_LOG, offset)
    log(f"dockerd (pid {proc.pid}) answers after {time.monotonic() - t0:.1f} s "
        f"(engine {_server_version()})")


def ensure_engine(log: Log = print, timeout: float = DOCKERD_START_TIMEOUT) -> None:
    """Make sure a container engine answers.

    A machine whose engine answers is left alone.  Otherwise, for the default
    socket only: install ``docker.io`` when ``dockerd`` is missing (root,
    Debian/Ubuntu) and start ``dockerd`` in the background, waiting up to
    ``timeout`` seconds.  A DOCKER_HOST naming another engine is never
    replaced by a default one.
    """
    host = docker_host()
    where = host or "unix://" + DEFAULT_SOCKETS[0]
    r = _info(timeout=5)
    if r is not None and r.returncode == 0 and r.stdout.strip():
        log(f"engine answers at {where} (engine {_server_version()})")
        return
    if r is not None and "permission denied" in (r.stderr or "").lower():
        raise EngineError(
            f"the engine at {where} refuses this user (permission denied): add the user "
            f"to the docker group (`sudo usermod -aG docker $USER`, then log in again) "
            f"or run as root")
    if not is_default_host(host):
        raise EngineError(
            f"no engine answers at DOCKER_HOST={host}; trainbase only starts the "
            f"default engine, not one behind a custom DOCKER_HOST. Start that engine "
            f"(for a clean-room engine: scripts/clean-engine.sh) or unset DOCKER_HOST.")
    if not _is_root():
        raise EngineError(
            "no container engine answers and starting one needs root: run "
            "scripts/setup.sh as root, or start the engine yourself "
            "(`sudo systemctl start docker` / `sudo dockerd`)")
    running = _pid_alive(DOCKERD_PIDFILE)
    if running:
        log(f"dockerd (pid {running}) is running but not answering yet; waiting")
        _wait_for_engine(timeout, None, DOCKERD_LOG, 0)
        log("engine answers")
        return
    dockerd = _which("dockerd")
    if dockerd is None:
        _apt_install(["docker.io"], log, why="no container engine on this host")
        if engine_available():  # the package may have started it (systemd)
            log("engine answers (started by the docker.io package)")
            return
        dockerd = _which("dockerd")
        if dockerd is None:
            raise EngineError("docker.io was installed but no dockerd binary was found")
    _start_dockerd(dockerd, log, timeout)


def image_exists(ref: str) -> bool:
    c = _client()
    if c is None:
        return False
    return _run([c, "image", "inspect", "--format", "{{.Id}}", ref],
                timeout=30).returncode == 0


def _pull(ref: str, timeout: float) -> tuple:
    c = _need_client()
    r = _run([c, "pull", ref], timeout=timeout)
    msg = (r.stderr or r.stdout).strip().splitlines()
    return r.returncode == 0, (msg[-1] if msg else f"exit {r.returncode}")


def try_pull(ref: str, timeout: float = 60) -> bool:
    """``docker pull REF``; False on any failure or after ``timeout`` seconds."""
    return _pull(ref, timeout)[0]


# --------------------------------------------------------------------------
# base images from debootstrap
# --------------------------------------------------------------------------

def check_debian_suite(suite: str, ref: str = "") -> str | None:
    """Validate that ``suite`` is a Debian suite debootstrap can build from a
    Debian mirror.  Returns an explicit debootstrap script path when the
    installed debootstrap has none for it (a newer Debian codename), else None.
    """
    what = f"{ref} " if ref else ""
    if not re.fullmatch(r"[a-z][a-z0-9.+-]*", suite or ""):
        raise EngineError(f"invalid suite name {suite!r}")
    if suite in UBUNTU_SUITES:
        raise EngineError(
            f"{what}cannot be bootstrapped here: {suite} is an Ubuntu suite and only "
            f"Debian suites can be bootstrapped locally; the image must come from a registry")
    script = DEBOOTSTRAP_SCRIPTS / suite
    if script.exists():
        family = script.resolve().name
        if family != "sid":
            raise EngineError(
                f"{what}cannot be bootstrapped here: {suite} is not a Debian suite "
                f"(debootstrap script family {family!r}); only Debian suites can be "
                f"bootstrapped locally, the image must come from a registry")
        return None
    if suite in DEBIAN_SUITES:
        sid = DEBOOTSTRAP_SCRIPTS / "sid"
        return str(sid) if sid.exists() else None
    raise EngineError(
        f"{what}cannot be bootstrapped here: unknown suite {suite!r} (known Debian "
        f"suites: {', '.join(sorted(DEBIAN_SUITES))}); otherwise the image must come "
        f"from a registry")


def _label_safe(value: str, what: str) -> str:
    if not value or re.search(r"[\s\"'\\]", value):
        raise EngineError(f"{what} {value!r} must be non-empty without spaces or quotes")
    return value


def _mounts_under(root: str) -> list:
    root = os.path.realpath(root)
    found = []
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 1:
                mp = parts[1].encode().decode("unicode_escape")
                if mp == root or mp.startswith(root + "/"):
                    found.append(mp)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def _remove_tree(path: str, log: Log) -> None:
    """rm -rf, but first detach anything still mounted inside (an interrupted
    debootstrap can leave /proc or /sys mounted in the target)."""
    if not os.path.exists(path):
        return
    for mp in _mounts_under(path):
        _run(["umount", "-l", mp], timeout=30)
    left = _mounts_under(path)
    if left:
        log(f"warning: not removing {path}: still mounted: {', '.join(left)}")
        return
    shutil.rmtree(path, ignore_errors=True)


def _clear_dir(path: Path) -> None:
    if not path.is_dir() or path.is_symlink():
        return
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _sources_deb822(suite: str, mirror: str) -> str:
    rolling = suite in ("sid", "unstable", "experimental")
    suites = [suite] if rolling else [suite, f"{suite}-updates"]
    text = (f"Types: deb\nURIs: {mirror}\nSuites: {' '.join(suites)}\n"
            f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    if not rolling and suite not in ("buster", "oldoldstable") and mirror.rstrip("/").endswith("/debian"):
        sec = mirror.rstrip("/") + "-security"
        text += (f"\nTypes: deb\nURIs: {sec}\nSuites: {suite}-security\n"
                 f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    return text


def _slim_tree(root: Path, excludes: Sequence[str], includes: Sequence[str]) -> None:
    """Delete what dpkg ``path-exclude`` would not have installed (keeping
    ``path-include`` matches), then dangling links and empty directories."""
    def keep(rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, pat) for pat in includes)

    def dangling(p: str) -> bool:
        target = os.readlink(p)
        full = str(root) + target if target.startswith("/") else os.path.join(os.path.dirname(p), target)
        return not os.path.lexists(full)

    for pat in excludes:
        base = root / pat.lstrip("/").rsplit("/", 1)[0]
        if not base.is_dir() or base.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(base, topdown=False):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                p = os.path.join(dirpath, name)
                rel = "/" + os.path.relpath(p, root)
                if fnmatch.fnmatchcase(rel, pat) and not keep(rel):
                    os.unlink(p)
        changed = True
        while changed:
            changed = False
            for dirpath, dirnames, filenames in os.walk(base, topdown=False):
                for name in filenames + dirnames:
                    p = os.path.join(dirpath, name)
                    if os.path.islink(p):
                        if dangling(p):
                            os.unlink(p)
                            changed = True
                    elif os.path.isdir(p) and not os.listdir(p):
                        os.rmdir(p)
                        changed = True


def slim_rootfs(rootfs: str, suite: str, mirror: str, slim: bool) -> None:
    """Make a debootstrapped tree look like the official Debian image:
    docker-friendly apt/dpkg settings, deb822 sources, no apt lists or caches,
    no host files, and for ``slim`` the official "-slim" path excludes."""
    root = Path(rootfs)
    # host and build leftovers
    for rel in ("var/lib/apt/lists", "var/cache/apt", "dev", "tmp"):
        _clear_dir(root / rel)
    if (root / "debootstrap").is_dir():
        shutil.rmtree(root / "debootstrap")
    for rel in ("var/log/bootstrap.log", "var/log/apt/history.log", "var/log/apt/term.log",
                "var/log/alternatives.log", "var/log/dpkg.log",
                "etc/apt/apt.conf.d/01autoremove-kernels", "etc/machine-id"):
        p = root / rel
        if p.is_file() or p.is_symlink():
            p.unlink()
    # resolv.conf / hostname were copied from the host; docker mounts its own
    for rel in ("etc/resolv.conf", "etc/hostname"):
        p = root / rel
        if p.is_file() and not p.is_symlink():
            p.write_text("")
    if (root / "tmp").is_dir():
        (root / "tmp").chmod(0o1777)
    # apt sources like the official image (deb822, -updates, -security)
    sources_list = root / "etc/apt/sources.list"
    if sources_list.exists():
        sources_list.unlink()
    _write(root / "etc/apt/sources.list.d/debian.sources", _sources_deb822(suite, mirror))
    # docker-friendly package manager settings (as in the official images)
    _write(root / "usr/sbin/policy-rc.d",
           "#!/bin/sh\n# no services start during package installs in image builds\nexit 101\n", 0o755)
    _write(root / "etc/dpkg/dpkg.cfg.d/docker-apt-speedup",
           "# image builds need no fsync per unpacked file\nforce-unsafe-io\n")
    _write(root / "etc/apt/apt.conf.d/docker-autoremove-suggests",
           "// autoremove also what was only kept because something Suggests it\n"
           "Apt::AutoRemove::SuggestsImportant \"false\";\n")
    clean = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
    _write(root / "etc/apt/apt.conf.d/docker-clean",
           "// like the official image: an implicit `apt-get clean` after every install.\n"
           "// Builds that use a cache mount on /var/cache/apt should delete this file.\n"
           f"DPkg::Post-Invoke {{ {clean} }};\nAPT::Update::Post-Invoke {{ {clean} }};\n"
           "Dir::Cache::pkgcache \"\";\nDir::Cache::srcpkgcache \"\";\n")
    _write(root / "etc/apt/apt.conf.d/docker-gzip-indexes",
           "// keep package lists compressed on disk\nAcquire::GzipIndexes \"true\";\n")
    _write(root / "etc/apt/apt.conf.d/docker-no-languages",
           "// no Translation files\nAcquire::Languages \"none\";\n")
    if slim:
        cfg = ["# \"slim\" variant: files unnecessary in containers are excluded,",
               "# and this configuration keeps them that way."]
        cfg += [f"path-exclude {p}" for p in SLIM_EXCLUDES]
        cfg += [f"path-include {p}" for p in SLIM_INCLUDES]
        _write(root / "etc/dpkg/dpkg.cfg.d/docker", "\n".join(cfg) + "\n")
        _slim_tree(root, SLIM_EXCLUDES, SLIM_INCLUDES)


def _import_rootfs(rootfs: str, ref: str, suite: str, mirror: str) -> None:
    c = _need_client()
    label = (f"LABEL io.trainbase.base.source=debootstrap "
             f"io.trainbase.base.suite={suite} io.trainbase.base.mirror={mirror}")
    # tar's stderr goes to a file: a pipe could fill up and stall the stream
    with tempfile.TemporaryFile() as err:
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", rootfs, "-c", "."],
                               stdout=subprocess.PIPE, stderr=err)
        try:
            imp = subprocess.run([c, "import", "--change", 'CMD ["bash"]', "--change", label,
                                  "-", ref], stdin=tar.stdout, capture_output=True, text=True,
                                 check=False)
        finally:
            tar.stdout.close()
            tar.wait()
        err.seek(0)
        tar_err = err.read().decode(errors="replace")
    if tar.returncode != 0:
        raise EngineError(f"tar of {rootfs} failed (exit {tar.returncode}):\n{_tail(tar_err)}")
    if imp.returncode != 0:
        raise EngineError(f"docker import of {ref} failed (exit {imp.returncode}):\n"
                          f"{_tail(imp.stdout + imp.stderr)}")


def _image_size(ref: str) -> int | None:
    c = _client()
    r = _run([c, "image", "inspect", "--format", "{{.Size}}", ref], timeout=30) if c else None
    try:
        return int(r.stdout.strip()) if r and r.returncode == 0 else None
    except ValueError:
        return None


def _tag_of(ref: str) -> str:
    last = ref.rsplit("/", 1)[-1]
    return last.split("@", 1)[0].split(":", 1)[1] if ":" in last.split("@", 1)[0] else ""


def ensure_base_image(ref: str, suite: str | None = None, mirror: str = DEFAULT_MIRROR,
                      log: Log = print, pull_timeout: float = 60) -> str:
    """Make ``ref`` available in the engine; returns "present", "pulled" or
    "bootstrapped".

    Bootstrapping (when the pull fails and ``suite`` is given) runs
    ``debootstrap --variant=minbase SUITE DIR MIRROR``, trims the tree like the
    official image (official "-slim" excludes when the tag contains "slim"),
    and imports it as exactly ``ref`` with ``CMD ["bash"]`` and
    ``io.trainbase.base.*`` labels.
    """
    if not engine_available():
        raise EngineError("no container engine answers: run `python -m trainbase.engine ensure`"
                          + (f" (DOCKER_HOST={docker_host()})" if docker_host() else ""))
    if image_exists(ref):
        log(f"{ref}: present")
        return "present"
    log(f"{ref}: not present, trying docker pull (timeout {pull_timeout:g} s)")
    t0 = time.monotonic()
    ok, why = _pull(ref, pull_timeout)
    if ok:
        log(f"{ref}: pulled in {time.monotonic() - t0:.1f} s")
        return "pulled"
    log(f"{ref}: pull failed after {time.monotonic() - t0:.1f} s: {why}")
    if not suite:
        raise EngineError(
            f"{ref} is not in the engine and could not be pulled ({why}); it must come from "
            f"a registry (only Debian suites can be bootstrapped locally: pass the suite, "
            f"e.g. `python -m trainbase.engine base debian:12-slim bookworm`)")
    check_debian_suite(suite, ref)  # cheap checks before installing anything
    _label_safe(suite, "suite")
    _label_safe(mirror, "mirror")
    if not _is_root():
        raise EngineError(f"bootstrapping {ref} with debootstrap needs root")
    if _which("debootstrap") is None:
        _apt_install(["debootstrap"], log, why=f"bootstrapping {ref}")
    script = check_debian_suite(suite, ref)
    tmp = tempfile.mkdtemp(prefix="trainbase-rootfs-",
                           dir=os.environ.get("TMPDIR") or "/var/tmp")
    rootfs = os.path.join(tmp, "rootfs")
    try:
        cmd = [_which("debootstrap") or "debootstrap", "--variant=minbase", suite, rootfs, mirror]
        if script:
            cmd.append(script)
        log(f"{ref}: debootstrap --variant=minbase {suite} {rootfs} {mirror}")
        t1 = time.monotonic()
        r = _run(cmd, env=dict(os.environ, PATH=_sbin_path()))
        if r.returncode != 0:
            detail = _tail(r.stdout + r.stderr)
            dlog = Path(rootfs, "debootstrap", "debootstrap.log")
            if dlog.exists():
                detail += f"\n  {dlog}:\n" + _tail(dlog.read_text(errors="replace"))
            raise EngineError(f"debootstrap of {suite} from {mirror} failed "
                              f"(exit {r.returncode}):\n{detail}")
        t_boot = time.monotonic() - t1
        slim = "slim" in _tag_of(ref)
        slim_rootfs(rootfs, suite, mirror, slim=slim)
        try:
            have = Path(rootfs, "etc/debian_version").read_text().strip()
        except OSError:
            have = "?"
        tag = _tag_of(ref)
        m = re.match(r"(\d+(?:\.\d+)*)", tag)
        if m and not (have == m.group(1) or have.startswith(m.group(1) + ".")):
            log(f"{ref}: note: the tag says {m.group(1)} but the mirror's {suite} is "
                f"{have} (a mirror serves only the current point release)")
        t2 = time.monotonic()
        _import_rootfs(rootfs, ref, suite, mirror)
        size = _image_size(ref)
        log(f"{ref}: bootstrapped Debian {have} ({suite}{', slim' if slim else ''}): "
            f"debootstrap {t_boot:.0f} s, import {time.monotonic() - t2:.0f} s, "
            f"size {size / 1e6:.0f} MB" if size else f"{ref}: bootstrapped")
    finally:
        _remove_tree(tmp, log)
    return "bootstrapped"


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainbase.engine",
                                 description="trainbase host/engine set-up")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="make sure a container engine answers (start dockerd if needed)")
    b = sub.add_parser("base", help="make a base image available (present, pull, or debootstrap)")
    b.add_argument("ref", help="image reference, e.g. debian:12.12-slim")
    b.add_argument("suite", nargs="?", help="Debian suite to bootstrap if the pull fails, e.g. bookworm")
    b.add_argument("--mirror", default=DEFAULT_MIRROR)
    sub.add_parser("cli", help="print the docker client used for BuildKit builds")
    sub.add_parser("ping", help="exit 0 when a container engine answers, 1 otherwise")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"trainbase: {msg}", file=sys.stderr, flush=True)

    try:
        if args.cmd == "ensure":
            ensure_engine(log=log)
        elif args.cmd == "base":
            print(ensure_base_image(args.ref, args.suite, args.mirror, log=log))
        elif args.cmd == "cli":
            print(docker_cli())
        elif args.cmd == "ping":
            return 0 if engine_available() else 1
    except EngineError as exc:
        print(f"trainbase: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
