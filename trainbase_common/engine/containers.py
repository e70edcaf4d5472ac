"""Containers and their networks: started with the options a host can give them, commands
run in them (with stdin, stdout and stderr apart), files copied in, and removed."""

from __future__ import annotations

import io
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sdk import EngineError, call, client, unless_absent


@dataclass(frozen=True)
class RunOptions:
    """What a container may be given (the conformance suite derives it from the host)."""

    shm_size: str = "1g"
    init: bool = True
    gpus: bool = False
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    tmpfs: tuple[str, ...] = ()  # mount points given a tmpfs (a volume one node of a job may lack)
    user: str = ""  # uid[:gid] the container runs as (HPC sites run the user's own uid)
    read_only: bool = False  # a read-only root filesystem (enroot, Apptainer SIF, hardened sites)
    env: tuple[tuple[str, str], ...] = ()  # variables set for the container (name, value)

    def describe(self) -> str:
        """The same as docker run flags, for reports."""
        flags = (
            [f"--shm-size={self.shm_size}"]
            + (["--init"] if self.init else [])
            + (["--gpus", "all"] if self.gpus else [])
            + (["--user", self.user] if self.user else [])
        )
        pairs = (
            [("--device", d) for d in self.devices]
            + [("--cap-add", c) for c in self.cap_add]
            + [("--tmpfs", t) for t in self.tmpfs]
            + [("-e", f"{k}={v}") for k, v in self.env]
        )
        return " ".join(flags + [a for p in pairs for a in p] + (["--read-only"] if self.read_only else []))


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


def run_detached(
    image: str,
    command: list[str],
    *,
    name: str,
    labels: dict[str, str],
    opts: RunOptions,
    hostname: str | None = None,
    network: str | None = None,
) -> str:
    """Start a long-running container; its id. The image's entrypoint is kept."""
    import docker

    kw: dict[str, Any] = dict(
        detach=True,
        name=name,
        labels=labels,
        shm_size=opts.shm_size,
        init=opts.init,
        devices=[f"{d}:{d}" for d in opts.devices],
        cap_add=list(opts.cap_add),
        # "PATH" or "PATH:OPTIONS" (as `docker run --tmpfs` takes them, e.g. "/tmp:exec")
        tmpfs={t.partition(":")[0]: t.partition(":")[2] for t in opts.tmpfs},
        read_only=opts.read_only,
        environment=dict(opts.env),
    )
    kw.update({k: v for k, v in (("user", opts.user), ("hostname", hostname), ("network", network)) if v})
    if opts.gpus:
        kw["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    c = call(client().containers.run, image, command, **kw)
    if network and hostname:  # the alias other containers resolve it by
        net = call(client().networks.get, network)
        call(net.disconnect, c)
        call(net.connect, c, aliases=[hostname])
    return str(c.id)


def exec_in(cid: str, argv: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> ExecResult:
    """Run argv in a running container and wait (bound it with coreutils' `timeout` in argv)."""
    api = client().api
    ex = call(api.exec_create, cid, argv, environment=env or None, stdin=stdin is not None)
    if stdin is None:
        out, err = call(api.exec_start, ex["Id"], demux=True)
    else:
        sock = call(api.exec_start, ex["Id"], socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.sendall(stdin.encode())
        raw.shutdown(1)  # EOF on the command's stdin
        out, err = demux(raw)
        sock.close()
    rc = call(api.exec_inspect, ex["Id"]).get("ExitCode")
    return ExecResult(
        returncode=rc if rc is not None else -1,
        stdout=(out or b"").decode(errors="replace"),
        stderr=(err or b"").decode(errors="replace"),
    )


def demux(sock: Any) -> tuple[bytes, bytes]:
    """Read a multiplexed exec stream (8-byte frame headers: stream, 0, 0, 0, size) to its end."""
    data = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    streams, i = [b"", b""], 0  # stdout (and stdin echo), stderr
    while i + 8 <= len(data):
        kind, size = data[i], int.from_bytes(data[i + 4 : i + 8], "big")
        streams[kind == 2] += data[i + 8 : i + 8 + size]
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
    if not call(client().api.put_archive, cid, dst_dir, buf.getvalue()):
        raise EngineError(f"copying {src} into {cid[:12]}:{dst_dir} failed")


def labelled_containers(label: str) -> list[tuple[str, str, dict[str, str]]]:
    """(id, name, labels) of every container, running or not, that carries LABEL."""
    return [
        (str(c.id), str(c.name), dict(c.labels or {}))
        for c in call(client().containers.list, all=True, filters={"label": label})
    ]


def remove_container(cid: str) -> None:
    unless_absent(client().api.remove_container, cid, force=True, v=True)


def create_network(labels: dict[str, str], prefix: str = "tbnet") -> str:
    """A user-defined bridge (containers resolve each other by name/alias). Not ``internal``: with
    no route out the engine's DNS waits 10 s per name it forwards, and PyTorch's TCPStore looks up
    every client's address (a 4-process gloo job: 16-26 s instead of 7; no real cluster does that)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    call(client().networks.create, name, driver="bridge", labels=labels)
    return name


def remove_network(name: str) -> None:
    unless_absent(client().api.remove_network, name)
