"""The adapter to the Docker engine: every docker call of trainbase's build and conformance
packages goes through here (or, for BuildKit builds only, through its sibling `buildkit`),
typed, and nothing else reads docker output.

The docker SDK (pinned `docker`) for everything it does well: engine facts, images (inspect,
tag, remove, pull, push, import, save), registry lookups with the credentials `docker login`
stored, containers, exec, networks. DOCKER_HOST (and DOCKER_CONFIG) are honoured.
"""

from __future__ import annotations

import functools
import io
import os
import re
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import docker

class EngineError(Exception):
    """The engine (or a docker client for builds) is not usable; the message says why."""


class EngineAPIError(EngineError):
    """The engine answered a request with an error (status: the HTTP status it gave)."""

    def __init__(self, status: int | None, message: str):
        self.status = status
        super().__init__(message)


# --------------------------------------------------------------------------- the SDK client

@functools.lru_cache(maxsize=4)
def _sdk(host: str, config: str) -> docker.DockerClient:
    import docker

    try:
        return docker.from_env(timeout=600)
    except docker.errors.DockerException as e:
        raise EngineError(f"no Docker engine answers{f' at DOCKER_HOST={host}' if host else ''}: {e}") from None


def client() -> docker.DockerClient:
    """The docker SDK client for this DOCKER_HOST / DOCKER_CONFIG (cached per pair)."""
    return _sdk(os.environ.get("DOCKER_HOST", ""), os.environ.get("DOCKER_CONFIG", ""))


def _api_error(e: Exception) -> EngineAPIError:
    status = getattr(e, "status_code", None)
    text = getattr(e, "explanation", None) or str(e)
    return EngineAPIError(status, f"{status} {' '.join(str(text).split())}" if status else " ".join(str(text).split()))


def _call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    # Any, not fn's own return type: the SDK's overloads (containers.run, exec_start) pick their
    # return type from keyword values this adapter passes in a dict; each caller below turns the
    # answer into a typed value (ImageInfo, ExecResult, str).
    import docker

    try:
        return fn(*args, **kw)
    except docker.errors.NotFound as e:
        raise EngineAPIError(404, f"404 {e.explanation or e}") from None
    except docker.errors.APIError as e:
        raise _api_error(e) from None
    except (docker.errors.DockerException, OSError) as e:
        raise EngineError(str(e)) from None


# --------------------------------------------------------------------------- engine facts

def available() -> bool:
    """True when the engine answers a ping."""
    try:
        return bool(_call(client().ping))
    except EngineError:
        return False


def server_version() -> str:
    try:
        return str(_call(client().version).get("Version", "?"))
    except EngineError:
        return "?"


@dataclass(frozen=True)
class EngineInfo:
    root_dir: str
    driver: str
    runtimes: tuple[str, ...]


def info() -> EngineInfo:
    i = _call(client().info)
    return EngineInfo(root_dir=i.get("DockerRootDir", ""), driver=i.get("Driver", ""),
                      runtimes=tuple(sorted(i.get("Runtimes") or {})))


# --------------------------------------------------------------------------- images

@dataclass(frozen=True)
class ImageInfo:
    id: str
    size: int
    labels: dict[str, str]
    env: dict[str, str]
    raw: dict[str, Any] = field(repr=False, compare=False)


def inspect_image(ref: str) -> ImageInfo | None:
    """The image's facts, or None when the engine has no such image."""
    try:
        attrs = _call(client().api.inspect_image, ref)
    except EngineAPIError as e:
        if e.status == 404:
            return None
        raise
    cfg = attrs.get("Config") or {}
    env = dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
    return ImageInfo(id=attrs["Id"], size=int(attrs.get("Size", 0)), labels=dict(cfg.get("Labels") or {}), env=env,
                     raw=attrs)


def image_exists(ref: str) -> bool:
    try:
        return inspect_image(ref) is not None
    except EngineError:
        return False


def tag(src: str, dst: str) -> None:
    repo, _, t = dst.rpartition(":") if ":" in dst.rsplit("/", 1)[-1] else (dst, "", "latest")
    if not _call(client().api.tag, src, repo, t):
        raise EngineError(f"tagging {src} as {dst} failed")


def _unless_absent(fn: Callable[..., Any], *args: Any, **kw: Any) -> bool:
    """Call; False instead of the error when the engine says 404 (nothing of that name)."""
    try:
        _call(fn, *args, **kw)
        return True
    except EngineAPIError as e:
        if e.status != 404:
            raise
        return False


def remove_image(ref: str, force: bool = False) -> bool:
    """Remove a tag (the image goes when its last tag does); False when there was none."""
    return _unless_absent(client().api.remove_image, ref, force=force)


def list_tags(reference: str) -> list[str]:
    """Every local REPO:TAG matching a reference filter such as ``trainbase/*``."""
    images = _call(client().images.list, filters={"reference": reference})
    return sorted({t for im in images for t in im.tags})


def repository(ref: str) -> str:
    """``nvidia/cuda:12.8.1-devel`` -> ``nvidia/cuda``; a digest goes too, and a registry port
    is not a tag (``host:5000/x:1`` -> ``host:5000/x``)."""
    ref = ref.split("@", 1)[0]
    name, _, tag = ref.rpartition(":")
    return name if name and "/" not in tag else ref


def pull(ref: str) -> None:
    """Pull with the stored credentials. Raises EngineAPIError (its status says why). A
    ``name@sha256:...`` reference is pulled by that digest (the API takes it as the tag)."""
    if "@" in ref:
        repo, t = repository(ref), ref.partition("@")[2]
    else:
        repo, _, t = ref.rpartition(":")
    _call(client().images.pull, repo, tag=t)


def push(ref: str) -> str:
    """Push with the stored credentials; the pushed manifest's digest."""
    repo, _, t = ref.rpartition(":")
    digest = ""
    for line in _call(client().images.push, repo, tag=t, stream=True, decode=True):
        if "error" in line or "errorDetail" in line:
            msg = (line.get("errorDetail") or {}).get("message") or line.get("error") or "push failed"
            m = re.search(r"\b(401|403)\b", msg)
            raise EngineAPIError(int(m.group(1)) if m else None, " ".join(str(msg).split()))
        digest = (line.get("aux") or {}).get("Digest", digest)
    if not digest:
        raise EngineAPIError(None, f"pushing {ref} reported no digest")
    return digest


def distribution_digest(ref: str) -> str:
    """The registry's digest for REF, asked through the engine with the stored credentials.
    Raises EngineAPIError: 404 when the tag does not exist, else what the registry said."""
    return str(_call(client().api.inspect_distribution, ref)["Descriptor"]["digest"])


def import_rootfs(tar_path: str | Path, ref: str, changes: Iterable[str] = ()) -> str:
    """`docker import` of a root filesystem tarball under REF; the new image's id."""
    repo, _, t = ref.rpartition(":")
    out = _call(client().api.import_image_from_file, str(tar_path), repository=repo, tag=t, changes=list(changes))
    info_ = inspect_image(ref)
    if info_ is None:
        raise EngineError(f"importing {tar_path} as {ref} left no image: {str(out)[-300:]}")
    return info_.id


class _ChunkReader(io.RawIOBase):
    """A file object over the SDK's stream of chunks (for tarfile's streaming mode)."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks, self.buf = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.buf:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.buf = chunk
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


def check_export_space(ref: str, margin_gb: float = 1.0) -> None:
    """Refuse a `docker save` that would fill the disk. The engine writes the whole export
    under its data root before it streams a byte (`/var/lib/docker/tmp/docker-export-*`), so
    reading an 8 GB image's layers needs 8 GB free there, next to what concurrent builds
    write. Measured: two framework images read at once with 8.6 GB free failed half-way with
    "no space left on device". Skipped where the data root is not on this machine."""
    import shutil

    image = inspect_image(ref)
    root = info().root_dir
    if image is None or not root or not os.path.isdir(root):
        return
    free = shutil.disk_usage(root).free
    need = image.size + margin_gb * 1e9
    if free < need:
        raise EngineError(f"reading the layers of {ref} needs about {need / 1e9:.1f} GB free under {root} "
                          f"(the engine writes the whole export there first); {free / 1e9:.1f} GB free: "
                          "prune old images and build cache (`docker system prune`, `docker builder prune`)")


def save(ref: str) -> io.BufferedReader:
    """`docker save REF` as a stream (the image's layers as the engine stores them)."""
    image = _call(client().images.get, ref)
    return io.BufferedReader(_ChunkReader(iter(_call(image.save, chunk_size=1 << 20))), 1 << 20)


def build_legacy(context: str | Path, ref: str, build_args: dict[str, str], network: str | None = None) -> None:
    """A small build with the engine's classic builder (no BuildKit features needed: the conformance
    self-test's broken variants; ``network``: host, for an engine without a NAT bridge). Raises EngineAPIError."""
    import docker

    try:
        client().images.build(path=str(context), tag=ref, buildargs=build_args, rm=True, forcerm=True, network_mode=network)
    except docker.errors.BuildError as e:
        tail = " | ".join(str(x.get("stream") or x.get("error") or "").strip() for x in list(e.build_log)[-6:])
        raise EngineAPIError(None, f"building {ref} failed: {e.msg}: {tail}") from None
    except docker.errors.APIError as e:
        raise _api_error(e) from None


# --------------------------------------------------------------------------- containers

@dataclass(frozen=True)
class RunOptions:
    """What a container may be given (the conformance suite derives it from the host)."""

    shm_size: str = "1g"
    init: bool = True
    gpus: bool = False
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    tmpfs: tuple[str, ...] = ()  # mount points given a tmpfs (a volume one node of a job may lack)
    user: str = ""               # uid[:gid] the container runs as (HPC sites run the user's own uid)
    read_only: bool = False      # a read-only root filesystem (enroot, Apptainer SIF, hardened sites)
    env: tuple[tuple[str, str], ...] = ()   # variables set for the container (name, value)

    def describe(self) -> str:
        """The same as docker run flags, for reports."""
        flags = [f"--shm-size={self.shm_size}"] + (["--init"] if self.init else []) + \
            (["--gpus", "all"] if self.gpus else []) + (["--user", self.user] if self.user else [])
        pairs = [("--device", d) for d in self.devices] + [("--cap-add", c) for c in self.cap_add] + \
            [("--tmpfs", t) for t in self.tmpfs] + [("-e", f"{k}={v}") for k, v in self.env]
        return " ".join(flags + [a for p in pairs for a in p] + (["--read-only"] if self.read_only else []))


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


def run_detached(image: str, command: list[str], *, name: str, labels: dict[str, str], opts: RunOptions,
                 hostname: str | None = None, network: str | None = None) -> str:
    """Start a long-running container; its id. The image's entrypoint is kept."""
    import docker

    kw: dict[str, Any] = dict(detach=True, name=name, labels=labels, shm_size=opts.shm_size, init=opts.init,
                              devices=[f"{d}:{d}" for d in opts.devices], cap_add=list(opts.cap_add),
                              tmpfs=dict.fromkeys(opts.tmpfs, ""), read_only=opts.read_only, environment=dict(opts.env))
    kw.update({k: v for k, v in (("user", opts.user), ("hostname", hostname), ("network", network)) if v})
    if opts.gpus:
        kw["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    c = _call(client().containers.run, image, command, **kw)
    if network and hostname:                       # the alias other containers resolve it by
        net = _call(client().networks.get, network)
        _call(net.disconnect, c)
        _call(net.connect, c, aliases=[hostname])
    return str(c.id)


def exec_in(cid: str, argv: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:
    """Run argv in a running container and wait (bound it with coreutils' `timeout` in argv)."""
    api = client().api
    ex = _call(api.exec_create, cid, argv, environment=env or None, stdin=stdin is not None)
    if stdin is None:
        out, err = _call(api.exec_start, ex["Id"], demux=True)
    else:
        sock = _call(api.exec_start, ex["Id"], socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.sendall(stdin.encode())
        raw.shutdown(1)                            # EOF on the command's stdin
        out, err = _demux(raw)
        sock.close()
    rc = _call(api.exec_inspect, ex["Id"]).get("ExitCode")
    return ExecResult(returncode=rc if rc is not None else -1, stdout=(out or b"").decode(errors="replace"),
                      stderr=(err or b"").decode(errors="replace"))


def _demux(sock: Any) -> tuple[bytes, bytes]:
    """Read a multiplexed exec stream (8-byte frame headers: stream, 0, 0, 0, size) to its end."""
    data = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    streams, i = [b"", b""], 0                     # stdout (and stdin echo), stderr
    while i + 8 <= len(data):
        kind, size = data[i], int.from_bytes(data[i + 4:i + 8], "big")
        streams[kind == 2] += data[i + 8:i + 8 + size]
        i += 8 + size
    return streams[0], streams[1]


def copy_into(cid: str, src: str | Path, dst_dir: str) -> None:
    """Copy a file, or a directory's contents, into DST_DIR of a container."""
    buf = io.BytesIO()
    src = Path(src)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if src.is_dir():
            for p in sorted(src.iterdir()):
                tar.add(str(p), arcname=p.name)
        else:
            tar.add(str(src), arcname=src.name)
    if not _call(client().api.put_archive, cid, dst_dir, buf.getvalue()):
        raise EngineError(f"copying {src} into {cid[:12]}:{dst_dir} failed")


def remove_container(cid: str) -> None:
    _unless_absent(client().api.remove_container, cid, force=True, v=True)


def export_filesystem(image: str, out: IO[bytes]) -> None:
    """The image's flattened filesystem as a tar stream into the binary file ``out`` (create + export)."""
    cid = _call(client().api.create_container, image, command=["true"])["Id"]
    try:
        for chunk in _call(client().api.export, cid):
            out.write(chunk)
    finally:
        remove_container(cid)


def create_network(labels: dict[str, str], prefix: str = "tbnet") -> str:
    """A user-defined bridge (containers resolve each other by name/alias). Not ``internal``: with
    no route out the engine's DNS waits 10 s per name it forwards, and PyTorch's TCPStore looks up
    every client's address (a 4-process gloo job: 16-26 s instead of 7; no real cluster does that)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    _call(client().networks.create, name, driver="bridge", labels=labels)
    return name


def remove_network(name: str) -> None:
    _unless_absent(client().api.remove_network, name)


def image_history(ref: str) -> list[dict[str, Any]]:
    """`docker history REF`, bottom layer first: [{"created_by": ..., "size": bytes}] (metadata steps: 0)."""
    image = _call(client().images.get, ref)
    steps = _call(image.history)               # the engine lists the newest step first
    return [{"created_by": str(h.get("CreatedBy") or ""), "size": int(h.get("Size") or 0)} for h in reversed(steps)]
