"""An image's files read out of the engine: its layers as the engine stores them (`docker
save`, after checking the engine has the room to stage it), or its flattened filesystem
(a container created and exported)."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator
from typing import IO, Any

from .containers import remove_container
from .images import inspect_image
from .sdk import EngineError, call, client, info


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
    image = inspect_image(ref)
    root = info().root_dir
    if image is None or not root or not os.path.isdir(root):
        return
    free = shutil.disk_usage(root).free
    need = image.size + margin_gb * 1e9
    if free < need:
        raise EngineError(
            f"reading the layers of {ref} needs about {need / 1e9:.1f} GB free under {root} "
            f"(the engine writes the whole export there first); {free / 1e9:.1f} GB free: "
            "prune old images and build cache (`docker system prune`, `docker builder prune`)"
        )


def save(ref: str) -> io.BufferedReader:
    """`docker save REF` as a stream (the image's layers as the engine stores them)."""
    image = call(client().images.get, ref)
    return io.BufferedReader(_ChunkReader(iter(call(image.save, chunk_size=1 << 20))), 1 << 20)


def export_filesystem(image: str, out: IO[bytes]) -> None:
    """The image's flattened filesystem as a tar stream into the binary file ``out`` (create +
    export)."""
    cid = call(client().api.create_container, image, command=["true"])["Id"]
    try:
        for chunk in call(client().api.export, cid):
            out.write(chunk)
    finally:
        remove_container(cid)
