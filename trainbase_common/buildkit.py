"""The one path to the Docker engine that does not go through the SDK: BuildKit builds. Their
secrets and cache mounts (`RUN --mount`) need the docker CLI (the SDK's build API is the
legacy builder); this module picks a client that can run them and writes the command.
Everything else goes through `engine`."""

from __future__ import annotations

import functools
import os
import re
import subprocess

from .engine import EngineError

# Client versions where `DOCKER_BUILDKIT=1 docker build` uses the engine's BuildKit directly
# (no buildx plugin) and `RUN --mount` works without a `# syntax=` line. From client 23 on,
# that path needs the buildx plugin.
CLASSIC_BUILDKIT_MIN = (20, 10)
CLASSIC_BUILDKIT_MAX = (23, 0)  # exclusive


_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, ...] | None:
    """First ``X.Y[.Z]`` in ``text`` as a tuple of ints (``"Docker version 20.10.24+dfsg1"`` -> (20, 10, 24))."""
    m = _VERSION_RE.search(text or "")
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _run(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def candidate_clients(path_env: str) -> list[str]:
    """Every distinct ``docker`` executable on PATH (then the usual places), in PATH order;
    symlinked duplicates are dropped."""
    dirs = [d for d in path_env.split(os.pathsep) if d] + ["/usr/local/bin", "/usr/bin"]
    seen: set[str] = set()
    out: list[str] = []
    for d in dirs:
        p = os.path.join(d, "docker")
        if os.path.isfile(p) and os.access(p, os.X_OK) and os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            out.append(p)
    return out


def client_version(cli: str) -> tuple[int, ...] | None:
    """The client's own version (`docker --version`); never contacts the engine."""
    r = _run([cli, "--version"])
    return parse_version(r.stdout) if r.returncode == 0 else None


def has_buildx(cli: str) -> bool:
    return _run([cli, "buildx", "version"]).returncode == 0


@functools.lru_cache(maxsize=8)
def _select_build_cli(path_env: str, override: str) -> str:
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise EngineError(f"TRAINBASE_DOCKER={override} is not an executable file")
        return override
    clients = candidate_clients(path_env)
    if not clients:
        raise EngineError("no docker client found on PATH: run scripts/setup.sh (or `apt-get install -y docker.io`)")
    for c in clients:
        if has_buildx(c):
            return c
    notes = []
    for c in clients:
        v = client_version(c)
        if v is not None and CLASSIC_BUILDKIT_MIN <= v[:2] < CLASSIC_BUILDKIT_MAX:
            return c
        why = (
            "needs the buildx plugin for BuildKit, and `docker buildx version` fails"
            if v and v[:2] >= CLASSIC_BUILDKIT_MAX
            else "too old for BuildKit cache/secret mounts"
            if v
            else "version could not be read"
        )
        notes.append(f"  {c} ({'.'.join(map(str, v)) if v else 'unknown version'}): {why}")
    raise EngineError(
        "no docker client can run BuildKit builds (DOCKER_BUILDKIT=1 docker build with --secret and "
        "RUN --mount):\n" + "\n".join(notes) + "\ninstall the buildx plugin (Debian 13: docker-buildx) "
        "or a 20.10-22.x client (Debian 12: docker.io), or point TRAINBASE_DOCKER at one"
    )


def build_cli() -> str:
    """A docker client that can run BuildKit builds: ``$TRAINBASE_DOCKER``, else the first on
    PATH whose ``buildx`` works, else the first in [20.10, 23) (classic DOCKER_BUILDKIT=1)."""
    return _select_build_cli(os.environ.get("PATH", ""), os.environ.get("TRAINBASE_DOCKER", ""))


def build_command(
    dockerfile: str,
    ref: str,
    *,
    labels: dict[str, str],
    build_args: dict[str, str],
    target: str | None = None,
    secrets: dict[str, str] | None = None,
    network: str | None = None,
    no_cache: bool = False,
    context: str = ".",
    platform: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The BuildKit build of REF (argv, environment); `docker build -t` tags only a completed image.
    ``platform``: the OCI platform to build for (another architecture runs under qemu)."""
    cmd = [build_cli(), "build", "--progress=plain", "-f", dockerfile, "-t", ref]
    if platform:
        cmd += ["--platform", platform]
    for k, v in labels.items():
        cmd += ["--label", f"{k}={v}"]
    for k, v in build_args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    if target:
        cmd += ["--target", target]
    for k, v in (secrets or {}).items():
        cmd += ["--secret", f"id={k},src={v}"]
    if network:
        cmd += ["--network", network]
    if no_cache:
        cmd += ["--no-cache"]
    return cmd + [context], dict(os.environ, DOCKER_BUILDKIT="1")
