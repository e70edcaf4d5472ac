"""Containers the checks exec into, and private networks for multi-node checks; all through
trainbase_common.engine. Every container and network carries the LABEL, so a crashed run's
leftovers can be found (`docker ps -a --filter label=io.trainbase.conformance`)."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainbase_common import engine
from trainbase_common.emulation import EmulationError

from . import LABEL
from .emulation import emulated_cpus, ensure_emulator


def short_name(ref: str) -> str:
    """``trainbase/openmpi4.1.4-...-debian12:r399db00a30bb`` -> ``openmpi4.1.4-...-debian12:r399db00a30bb``."""
    return ref.rsplit("/", 1)[-1]


def inspect_image(ref: str) -> dict[str, Any]:
    """The engine's full inspect document of an image (the suite reads Config.Env, Labels, Size)."""
    info = engine.inspect_image(ref)
    if info is None:
        raise RuntimeError(f"image {ref} is not in the engine")
    return info.raw


@dataclass
class Container:
    cid: str
    name: str
    image: str
    hostname: str = ""

    @classmethod
    def start(
        cls,
        image: str,
        opts: engine.RunOptions,
        *,
        hostname: str | None = None,
        network: str | None = None,
        prefix: str = "tbconf",
    ) -> Container:
        """`sleep infinity` in the image, keeping its entrypoint (NVIDIA bases wrap "$@"). An
        image of another architecture runs as the first CPU of emulation.emulated_cpus (a CPU
        its users have) unless ``opts`` names one."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        inspect = inspect_image(image)
        try:
            ensure_emulator(inspect)
        except EmulationError as e:
            raise RuntimeError(f"cannot start {image}: {e}") from None
        cpus = emulated_cpus(inspect)
        if cpus and "QEMU_CPU" not in dict(opts.env):
            opts = dataclasses.replace(opts, env=(*opts.env, ("QEMU_CPU", cpus[0][1])))
        try:
            cid = engine.run_detached(
                image,
                ["sleep", "infinity"],
                name=name,
                labels={LABEL: "1"},
                opts=opts,
                hostname=hostname,
                network=network,
            )
        except engine.EngineError as e:
            raise RuntimeError(f"starting {image} failed: {e}") from None
        return cls(cid=cid, name=name, image=image, hostname=hostname or "")

    def exec(
        self, cmd: str, timeout: float = 120, env: dict[str, str] | None = None, login: bool = False
    ) -> engine.ExecResult:
        """Run ``cmd`` through ``/bin/sh -c`` (the image's ENV, like testinfra) or, with
        ``login``, through ``bash -lc`` (what /etc/profile makes of it). coreutils' timeout
        bounds it inside the container (exit 124), so a hung command never hangs the suite."""
        shell = ["bash", "-lc"] if login else ["/bin/sh", "-c"]
        return engine.exec_in(self.cid, ["timeout", "-k", "10", str(int(timeout)), *shell, cmd], env=env)

    def put(self, src: str | Path, dst: str) -> None:
        """Copy a file, or a directory's contents (``src`` ending in "/."), into ``dst``."""
        engine.copy_into(self.cid, str(src).removesuffix("/."), dst)

    def write(self, path: str, text: str) -> None:
        r = engine.exec_in(self.cid, ["/bin/sh", "-c", f"cat > {shlex.quote(path)}"], stdin=text)
        if r.returncode != 0:
            raise RuntimeError(f"writing {path} in {self.name}: {r.stderr.strip()}")

    def read(self, path: str) -> str:
        r = self.exec(f"cat {shlex.quote(path)}", timeout=30)
        if r.returncode != 0:
            raise FileNotFoundError(f"{path} in {self.image}: {r.stderr.strip()}")
        return r.stdout

    def remove(self) -> None:
        engine.remove_container(self.cid)


def create_network() -> str:
    return engine.create_network({LABEL: "1"}, prefix="tbconf-net")


def remove_network(name: str) -> None:
    engine.remove_network(name)


@contextlib.contextmanager
def ssh_cluster(
    image: str,
    opts: Callable[[str], engine.RunOptions],
    hostnames: tuple[str, ...] = ("a", "b"),
    prepare: Callable[[Container], None] | None = None,
) -> Iterator[tuple[list[Container], str]]:
    """Containers of ``image`` (one per hostname) on a private network, sshd started in each
    with host keys made now and a client key made for this cluster only, every node known to
    every other: what `mpirun -H a,b` needs. ``opts(hostname)`` gives each its run options;
    ``prepare`` runs on each container once started (copying probes in)."""
    network = create_network()
    nodes: list[Container] = []
    try:
        for h in hostnames:
            nodes.append(Container.start(image, opts(h), hostname=h, network=network, prefix=f"tbconf-{h}"))
            if prepare:
                prepare(nodes[-1])
        for n in nodes:
            r = n.exec(
                "set -e; ssh-keygen -A >/dev/null; mkdir -p /run/sshd /root/.ssh; chmod 700 /root/.ssh; /usr/sbin/sshd"
            )
            assert r.returncode == 0, f"sshd did not start in {n.hostname}: {r.stderr.strip()}"
        r = nodes[0].exec(
            "ssh-keygen -q -t ed25519 -N '' -C tbconf -f /root/.ssh/id_ed25519 && cat /root/.ssh/id_ed25519.pub"
        )
        assert r.returncode == 0, f"ssh-keygen failed: {r.stderr.strip()}"
        pub = r.stdout.strip()
        hosts = " ".join(n.hostname for n in nodes)
        for n in nodes:
            n.write("/root/.ssh/authorized_keys", pub + "\n")
            r = n.exec(
                "chmod 600 /root/.ssh/authorized_keys; "
                f"for i in $(seq 50); do ssh-keyscan -t ed25519 {hosts} > /root/.ssh/known_hosts 2>/dev/null "
                f"&& [ $(wc -l < /root/.ssh/known_hosts) -eq {len(nodes)} ] && exit 0; sleep 0.2; done; exit 1"
            )
            assert r.returncode == 0, f"ssh-keyscan from {n.hostname} did not see every sshd"
        for n in nodes[1:]:
            r = nodes[0].exec(f"ssh -o BatchMode=yes {n.hostname} true", timeout=60)
            assert r.returncode == 0, f"ssh a -> {n.hostname} failed: {r.stderr.strip()}"
        yield nodes, network
    finally:
        for n in nodes:
            n.remove()
        remove_network(network)
