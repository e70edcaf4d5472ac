"""Every layer of an image, streamed from the engine's `docker save`: a file deleted by a later
layer is gone from the container but still ships in its own layer, so hygiene checks read the
layers, not the final filesystem. Plus the certificate and key readers those checks use."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from trainbase_common import engine


@dataclass
class LayerFile:
    layer: int  # 0 = bottom layer
    path: str  # without a leading slash
    kind: str  # file, dir, symlink, link, other
    size: int
    content: bytes | None = None  # only for the files the caller asked for


@dataclass
class LayerScan:
    image: str
    layers: list[str]  # layer tar names in order, bottom first
    created_by: list[str]  # the Dockerfile instruction of each layer (from the image history)
    files: list[LayerFile]
    seconds: float = 0.0

    def where(self, f: LayerFile) -> str:
        cmd = self.created_by[f.layer] if f.layer < len(self.created_by) else ""
        cmd = re.sub(r"\s+", " ", cmd).strip()
        cmd = re.sub(r"^(\|\d+ \S+=\S+ )?/bin/(ba)?sh (-o pipefail )?-c ", "RUN ", cmd)
        return f"/{f.path} (layer {f.layer + 1}/{len(self.layers)}: {cmd[:90]})"


_TAR_MAGIC_OFFSET = 257


def _is_tar_head(head: bytes) -> bool:
    return head[:2] == b"\x1f\x8b" or head[_TAR_MAGIC_OFFSET:_TAR_MAGIC_OFFSET + 5] == b"ustar"


class _Prefixed(io.RawIOBase):
    """A stream that first returns ``head`` then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: Any):
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.rest.read(len(b))
        b[:len(data)] = data
        return len(data)


def scan_layers(image: str, want_content: Callable[[str, int], bool], max_content: int = 4 << 20) -> LayerScan:
    """Stream the engine's save of IMAGE and list every entry of every layer (whiteouts included
    as the ``.wh.`` names they are). ``want_content(path, size)`` says which regular files'
    bytes to keep (at most ``max_content`` bytes each). Works with the classic save layout
    (``<id>/layer.tar``) and the OCI one (``blobs/sha256/<digest>``)."""
    t0 = time.monotonic()
    stream = engine.save(image)
    per_blob: dict[str, list[LayerFile]] = {}
    jsons: dict[str, bytes] = {}
    try:
        outer = tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20)
        for m in outer:
            if not m.isfile():
                continue
            if m.name.endswith(".json") or m.name.endswith("/json") or (m.size < 1 << 20 and m.name.startswith("blobs/")):
                data = outer.extractfile(m).read()  # type: ignore[union-attr]
                jsons[m.name] = data
                continue
            f = outer.extractfile(m)
            assert f is not None
            head = f.read(512)
            if not _is_tar_head(head):
                continue
            entries: list[LayerFile] = []
            inner = tarfile.open(fileobj=io.BufferedReader(_Prefixed(head, f), 1 << 20), mode="r|*",
                                 bufsize=1 << 20)
            for im in inner:
                path = im.name.lstrip("./").lstrip("/") if im.name not in (".", "./") else ""
                kind = ("file" if im.isreg() else "dir" if im.isdir() else "symlink" if im.issym()
                        else "link" if im.islnk() else "other")
                lf = LayerFile(layer=-1, path=path, kind=kind, size=im.size)
                if im.isreg() and want_content(path, im.size):
                    ef = inner.extractfile(im)
                    lf.content = ef.read(max_content) if ef else None
                entries.append(lf)
            per_blob[m.name] = entries
    finally:
        stream.close()
    # Layer order and history come from the save's manifest.json and the image config.
    manifest = json.loads(jsons["manifest.json"])[0]
    order: list[str] = manifest["Layers"]
    config = json.loads(jsons[manifest["Config"]])
    created = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    files: list[LayerFile] = []
    for i, name in enumerate(order):
        for lf in per_blob.get(name, []):
            lf.layer = i
            files.append(lf)
    return LayerScan(image=image, layers=order, created_by=created, files=files,
                     seconds=time.monotonic() - t0)


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)
_PEM_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")


def pem_certificates(data: bytes) -> set[str]:
    """SHA-256 fingerprints of the PEM certificates in ``data``."""
    out = set()
    for body in _PEM_CERT.findall(data):
        try:
            out.add(hashlib.sha256(base64.b64decode(b"".join(body.split()))).hexdigest())
        except ValueError:
            continue
    return out


def has_private_key(data: bytes) -> bool:
    return bool(_PEM_KEY.search(data))


def record_hashes(record: bytes, site: str) -> dict[str, str]:
    """A wheel's RECORD: installed path (relative to /) -> urlsafe-b64 sha256."""
    out = {}
    for line in record.decode(errors="replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            out[str(PurePosixPath(site, parts[0]))] = parts[1][len("sha256="):]
    return out


def wheel_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
