"""An image's layers read from the engine's overlay2 folders (trainbase_common.overlay_layers)
are its `docker save` layers, entry by entry, on a real image: the ci profile's base with a
layer that writes a hard link, a symlink, a fifo and files a second layer deletes (whiteouts)
and hides (an opaque directory), built by the engine as the self-test's variants are."""

from __future__ import annotations

import uuid

import pytest

from trainbase_common import engine, layers, overlay_layers

DOCKERFILE = """ARG BASE
FROM ${BASE}
RUN mkdir -p /opt/t/gone /opt/t/cache /etc/ssl/t && echo secret > /opt/t/gone/key \\
 && echo old > /opt/t/cache/old && echo a > /opt/t/file && ln /opt/t/file /opt/t/hardlink \\
 && ln -s file /opt/t/symlink && mkfifo /opt/t/fifo && echo pem > /etc/ssl/t/x.pem
RUN rm -rf /opt/t/gone /opt/t/cache && mkdir /opt/t/cache && echo new > /opt/t/cache/new
"""


def _want(path: str, size: int) -> bool:
    return path.startswith(("etc/ssl/", "opt/t/")) and size < 1 << 20


def _entries(scan: layers.LayerScan) -> set[tuple]:
    # the bottom layer's tar lists its root folder ("./"); a folder has no such entry
    return {(f.layer, f.path, f.kind, f.size, f.content, f.link) for f in scan.files if f.path}


@pytest.mark.slow
def test_the_engines_layer_folders_are_its_saved_layers(build_report, tmp_path, monkeypatch):
    base = next(c for c in build_report["cells"] if c["selected"] and c["parent"] is None)["image"]
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    tag = f"trainbase-test/layer-sources:{uuid.uuid4().hex[:8]}"
    engine.build_legacy(tmp_path, tag, {"BASE": base})
    try:
        if overlay_layers.layer_dirs(tag) is None:
            pytest.skip(
                f"this engine's layers are not overlay2 folders this user may read "
                f"(driver {engine.info().driver}): only `docker save` is used here"
            )
        folders = layers.scan_layers(tag, _want)
        monkeypatch.setenv("TRAINBASE_LAYER_SOURCE", "save")
        saved = layers.scan_layers(tag, _want)
    finally:
        engine.remove_image(tag, force=True)
    assert (folders.source, saved.source) == ("engine's overlay2 layer folders", "docker save")
    a, b = _entries(folders), _entries(saved)
    assert a == b, (
        f"{len(a - b)} entries only in the folders, {len(b - a)} only in the save: "
        f"{sorted(a - b)[:5]} / {sorted(b - a)[:5]}"
    )
    assert folders.created_by == saved.created_by and len(folders.layers) == len(saved.layers)
    top = len(saved.layers) - 1
    got = {(f.layer, f.path): f for f in saved.files}
    # each encoding overlayfs has its own form for was met, so the comparison covered it
    assert got[(top, "opt/t/.wh.gone")].kind == "file"
    assert got[(top, "opt/t/cache/.wh..wh..opq")].kind == "file"
    assert got[(top - 1, "opt/t/hardlink")].kind == "link" or got[(top - 1, "opt/t/file")].kind == "link"
    assert got[(top - 1, "opt/t/symlink")].kind == "symlink" and got[(top - 1, "opt/t/fifo")].kind == "other"
    assert layers.layer_waste(folders).total == layers.layer_waste(saved).total > 0
    print(
        f"\n{len(a)} entries in {len(saved.layers)} layers: folders {folders.seconds:.1f} s, "
        f"docker save {saved.seconds:.1f} s"
    )
