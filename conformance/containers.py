"""Containers the checks exec into, and private networks for multi-node checks; all through
trainbase_common.engine. Every container and network carries the LABEL, so a crashed run's
leftovers can be found (`docker ps -a --filter label=io.trainbase.conformance`)."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainbase_common import engine

from . import LABEL


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
    def start(cls, image: str, opts: engine.RunOptions, *, hostname: str | None = None,
              network: str | None = None, prefix: str = "tbconf") -> "Container":
        """`sleep infinity` in the image, keeping its entrypoint (NVIDIA bases wrap "$@")."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        try:
            cid = engine.run_detached(image, ["sleep", "infinity"], name=name, labels={LABEL: "1"}, opts=opts,
                                      hostname=hostname, network=network)
        except engine.EngineError as e:
            raise RuntimeError(f"starting {image} failed: {e}") from None
        return cls(cid=cid, name=name, image=image, hostname=hostname or "")

    def exec(self, cmd: str, timeout: float = 120, env: dict[str, str] | None = None,
             login: bool = False) -> engine.ExecResult:
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
