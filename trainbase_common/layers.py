"""Every layer of an image, streamed from the engine's `docker save`, and the bytes those layers
waste. A file deleted or overwritten by a later layer is gone from the container but still
ships in its own layer: the conformance suite's hygiene checks read the layers for what must
not ship at all, the build reports them for what ships for nothing. Shared by both packages."""

from __future__ import annotations

import dataclasses
import heapq
import io
import json
import posixpath
import re
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from trainbase_common import engine, overlay_layers
from trainbase_common.overlay_layers import OPAQUE, WHITEOUT, layer_instructions


@dataclass
class LayerFile:
    layer: int  # 0 = bottom layer
    path: str  # without a leading slash
    kind: str  # file, dir, symlink, link (a hard link), other
    size: int
    content: bytes | None = None  # only for the files the caller asked for
    link: str = ""  # a hard link's target path (same layer): the bytes it shares are stored once


def instruction(created_by: str, width: int = 90) -> str:
    """The Dockerfile instruction a history entry records, as a person wrote it: one line, the
    builders' shell wrapper (classic `/bin/sh -c #(nop)`, BuildKit `RUN |2 A=b /bin/sh -c ...
    # buildkit`) turned back into `RUN ...` / `ENV ...`, cut to WIDTH characters."""
    cmd = " ".join(created_by.split())
    cmd = re.sub(r" # buildkit$", "", cmd)
    cmd = re.sub(r"^/bin/(ba)?sh -c #\(nop\) *", "", cmd)
    cmd = re.sub(r"^(RUN )?(\|\d+( \S+=\S*)* )?/bin/(ba)?sh (-o \S+ |-[a-z]+ )*-c ", "RUN ", cmd)
    return cmd if len(cmd) <= width else cmd[: width - 3] + "..."


@dataclass
class LayerScan:
    image: str
    layers: list[str]  # layer tar names in order, bottom first
    created_by: list[str]  # the Dockerfile instruction of each layer (from the image history)
    files: list[LayerFile]
    seconds: float = 0.0
    source: str = "docker save"  # or the engine's overlay2 layer folders (trainbase_common.overlay_layers)

    def layer_label(self, layer: int) -> str:
        """``layer 3/12: RUN apt-get ...`` (numbered from 1, bottom first)."""
        cmd = self.created_by[layer] if 0 <= layer < len(self.created_by) else ""
        return f"layer {layer + 1}/{len(self.layers)}: {instruction(cmd)}"

    def where(self, f: LayerFile) -> str:
        return f"/{f.path} ({self.layer_label(f.layer)})"


_TAR_MAGIC_OFFSET = 257
_SMALL = 1 << 20  # configs and manifests are smaller; they are read whole


def _is_tar_head(head: bytes) -> bool:
    return head[:2] == b"\x1f\x8b" or head[_TAR_MAGIC_OFFSET : _TAR_MAGIC_OFFSET + 5] == b"ustar"


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
        b[: len(data)] = data
        return len(data)


def _entry_path(name: str) -> str:
    # removeprefix, not lstrip("./"): that would also eat the dot of a top-level `.wh.x` or `.cache`
    return name.removeprefix("./").lstrip("/").rstrip("/") if name not in (".", "./") else ""


def _read_layer(stream: Any, want_content: Callable[[str, int], bool], max_content: int) -> list[LayerFile]:
    entries: list[LayerFile] = []
    # (closing the TarFile leaves STREAM open: it was handed in)
    with tarfile.open(fileobj=stream, mode="r|*", bufsize=1 << 20) as inner:
        for im in inner:
            path = _entry_path(im.name)
            kind = (
                "file"
                if im.isreg()
                else "dir"
                if im.isdir()
                else "symlink"
                if im.issym()
                else "link"
                if im.islnk()
                else "other"
            )
            lf = LayerFile(
                layer=-1, path=path, kind=kind, size=im.size, link=_entry_path(im.linkname) if im.islnk() else ""
            )
            if im.isreg() and want_content(path, im.size):
                ef = inner.extractfile(im)
                lf.content = ef.read(max_content) if ef else None
            entries.append(lf)
    return entries


def scan_layers(image: str, want_content: Callable[[str, int], bool], max_content: int = 4 << 20) -> LayerScan:
    """Stream the engine's save of IMAGE and list every entry of every layer (whiteouts included
    as the ``.wh.`` names they are). ``want_content(path, size)`` says which regular files'
    bytes to keep (at most ``max_content`` bytes each). Works with the classic save layout
    (``<id>/layer.tar``, a layer saved twice being a symlink to the first) and the OCI one
    (``blobs/sha256/<digest>``, where a layer of a few bytes is as small as a config).

    Where the engine is local and keeps its layers in overlay2 folders this machine may read,
    those folders are read instead: the same entries, without the export (overlay_layers)."""
    direct = overlay_layers.read_image(image, want_content, max_content)
    if direct is not None:
        diff_ids, created, per_layer, seconds = direct
        return LayerScan(
            image=image,
            layers=diff_ids,
            created_by=created,
            seconds=seconds,
            source="engine's overlay2 layer folders",
            files=[
                LayerFile(layer=i, path=p, kind=k, size=s, content=c, link=ln)
                for i, entries in enumerate(per_layer)
                for p, k, s, c, ln in entries
            ],
        )
    with _EXPORT_LOCK:
        engine.check_export_space(image)
        return _scan_saved(image, engine.save(image), want_content, max_content)


# One export at a time: the engine stages each whole export on its data root's disk first, so
# two parallel builds' supply steps would need the room of both images at once.
_EXPORT_LOCK = threading.Lock()


def _scan_saved(image: str, stream: IO[bytes], want_content: Callable[[str, int], bool], max_content: int) -> LayerScan:
    t0 = time.monotonic()
    per_blob: dict[str, list[LayerFile]] = {}
    jsons: dict[str, bytes] = {}
    aliases: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20) as outer:
            for m in outer:
                if m.issym():
                    aliases[m.name] = posixpath.normpath(posixpath.join(posixpath.dirname(m.name), m.linkname))
                    continue
                if not m.isfile():
                    continue
                f = outer.extractfile(m)
                assert f is not None  # noqa: S101 -- a regular member (isfile above) always has a file
                head = f.read(512)
                if _is_tar_head(head):
                    per_blob[m.name] = _read_layer(
                        io.BufferedReader(_Prefixed(head, f), 1 << 20), want_content, max_content
                    )
                elif m.size < _SMALL or m.name.endswith((".json", "/json")):
                    jsons[m.name] = head + f.read()
    finally:
        stream.close()
    # Layer order and history come from the save's manifest.json and the image config.
    manifest = json.loads(jsons["manifest.json"])[0]
    order: list[str] = manifest["Layers"]
    config = json.loads(jsons[aliases.get(manifest["Config"], manifest["Config"])])
    created = layer_instructions(config)
    files: list[LayerFile] = []
    for i, name in enumerate(order):
        # a copy per position: one blob may be two layers of the image
        files += [dataclasses.replace(lf, layer=i) for lf in per_blob.get(aliases.get(name, name), [])]
    return LayerScan(image=image, layers=order, created_by=created, files=files, seconds=time.monotonic() - t0)


# --------------------------------------------------------------------------- wasted bytes


@dataclass(frozen=True)
class WastedFile:
    path: str
    size: int
    layer: int  # the layer that wrote it (0 = bottom)
    by_layer: int  # the layer that deleted, hid or overwrote it
    how: str  # deleted (a whiteout), hidden (an opaque or replaced directory above it), overwritten
    written_in: str  # LayerScan.layer_label of each
    removed_in: str


@dataclass
class Waste:
    total: int
    per_layer: list[int]  # per layer, bottom first: the bytes it ships that no container sees
    top: list[WastedFile] = field(default_factory=list)  # largest first


@dataclass
class _Write:
    layer: int
    kind: str
    size: int
    group: tuple[int, str] | None  # (layer, data path) of a regular file and its hard links


def layer_waste(scan: LayerScan, top: int = 10) -> Waste:
    """The bytes written in one layer that a later layer makes invisible: deleted by a whiteout
    (the path and everything under it), hidden by an opaque directory marker (everything under
    that directory from lower layers) or by a non-directory written over a directory, or
    overwritten (the same path written again). Directories, symlinks and hard links carry no
    bytes of their own; a file's bytes are wasted only once no hard link to them is left."""
    live: dict[str, _Write] = {}
    children: dict[str, set[str]] = {}  # directory -> paths below it ever written (stale ones allowed)
    members: dict[tuple[int, str], int] = {}  # hard-link group -> paths of it still visible
    group_size: dict[tuple[int, str], int] = {}
    per_layer = [0] * len(scan.layers)
    wasted: list[WastedFile] = []

    def register(path: str) -> None:
        while path:
            parent = posixpath.dirname(path)
            kids = children.setdefault(parent, set())
            if path in kids:
                return
            kids.add(path)
            path = parent

    def forget(path: str, by: int, how: str, subtree: bool = True) -> None:
        stack = [path]
        while stack:
            p = stack.pop()
            if subtree:
                stack += children.pop(p, ())
            w = live.pop(p, None)
            if w is None or w.group is None:
                continue
            members[w.group] -= 1
            size, (layer, data_path) = group_size[w.group], w.group
            if members[w.group] == 0 and size:  # the last path that showed these bytes
                per_layer[layer] += size
                wasted.append(
                    WastedFile(data_path, size, layer, by, how, scan.layer_label(layer), scan.layer_label(by))
                )

    by_layer: dict[int, list[LayerFile]] = {}
    for f in scan.files:
        by_layer.setdefault(f.layer, []).append(f)
    for layer in sorted(by_layer):
        entries = by_layer[layer]
        # A layer's whiteouts act on the layers beneath it only: apply them before its entries.
        for f in entries:
            name = posixpath.basename(f.path)
            if name == OPAQUE:
                for child in children.pop(posixpath.dirname(f.path), set()):
                    forget(child, layer, "hidden")
            elif name.startswith(WHITEOUT):
                forget(posixpath.join(posixpath.dirname(f.path), name[len(WHITEOUT) :]), layer, "deleted")
        for f in entries:
            if posixpath.basename(f.path).startswith(WHITEOUT) or not f.path:
                continue
            below = live.get(f.path)
            lower = below is not None and below.layer != layer
            lower_file = below is not None and lower and below.kind != "dir"
            if f.kind != "dir":  # replaces a file, or hides a directory (listed or implied) and all below
                if lower or f.path in children:
                    forget(f.path, layer, "overwritten" if lower_file else "hidden")
            elif lower_file:  # a directory merges with one beneath; replaces a file
                forget(f.path, layer, "overwritten", subtree=False)
            group = None
            if f.kind == "file":
                group = (layer, f.path)
                group_size[group], members[group] = f.size, 1
            elif f.kind == "link" and (layer, f.link) in members and (layer, f.link) in group_size:
                group = (layer, f.link)
                members[group] += 1
            live[f.path] = _Write(layer, f.kind, f.size, group)
            register(f.path)
    return Waste(
        total=sum(per_layer), per_layer=per_layer, top=heapq.nlargest(top, wasted, key=lambda w: (w.size, w.path))
    )


def waste_share(waste: Waste, image_size: int) -> float:
    """The wasted bytes as a share of the image's size (0.0 for an empty or unknown size)."""
    return waste.total / image_size if image_size > 0 else 0.0
