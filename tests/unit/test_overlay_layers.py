"""trainbase_common.overlay_layers: an image's layers read from the overlay2 driver's diff
folders (built here as a fake data root, in overlayfs' own encoding) list what the layer tars
list, and anything that is not exactly the engine's own local copy falls back to `docker save`.
(tests/build/test_layer_sources.py compares both sources on a real image.)"""

import hashlib
import json
import os

import pytest

from trainbase_common import engine, overlay_layers
from trainbase_common.layers import layer_waste, scan_layers

HISTORY = [
    {"created_by": "/bin/sh -c #(nop) ADD file:abc in / "},
    {"created_by": "/bin/sh -c #(nop)  ENV A=b", "empty_layer": True},
    {"created_by": "RUN /bin/sh -c mkdir -p /opt/t # buildkit"},
    {"created_by": "RUN /bin/sh -c rm -rf /opt/t/gone # buildkit"},
]


def _whiteout(path) -> None:
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))  # S_IFCHR 0:0, overlayfs' whiteout
    except PermissionError:
        pytest.skip("making a character device needs root (overlayfs' whiteout)")


def _opaque(path) -> None:
    for name in overlay_layers.OPAQUE_XATTRS:
        try:
            os.setxattr(path, name, b"y")
            return
        except OSError:
            continue
    pytest.skip("this filesystem takes no overlay xattr")


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A data root with three layer folders and the image config in the engine's image store;
    the engine answers with the image's GraphDriver, as a local overlay2 engine does."""
    dirs = [tmp_path / "overlay2" / name / "diff" for name in ("l0", "l1", "l2")]
    for d in dirs:
        d.mkdir(parents=True)
    l0, l1, l2 = dirs
    (l0 / "etc" / "ssl").mkdir(parents=True)
    (l0 / "etc" / "ssl" / "cert.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    (l0 / "usr" / "bin").mkdir(parents=True)
    (l0 / "usr" / "bin" / "perl5.36").write_bytes(b"x" * 100)
    os.link(l0 / "usr" / "bin" / "perl5.36", l0 / "usr" / "bin" / "perl")
    os.symlink("perl", l0 / "usr" / "bin" / "perl-link")
    os.mkfifo(l0 / "fifo")
    (l1 / "opt" / "t" / "gone").mkdir(parents=True)
    (l1 / "opt" / "t" / "gone" / "f").write_bytes(b"secret" * 10)
    (l1 / "opt" / "t" / "cache").mkdir()
    (l1 / "opt" / "t" / "cache" / "old").write_bytes(b"o" * 40)
    (l2 / "opt" / "t" / "cache").mkdir(parents=True)
    _opaque(l2 / "opt" / "t" / "cache")
    _whiteout(l2 / "opt" / "t" / "gone")
    config = json.dumps({"history": HISTORY, "rootfs": {"type": "layers"}}).encode()
    digest = hashlib.sha256(config).hexdigest()
    store = tmp_path / "image" / "overlay2" / "imagedb" / "content" / "sha256"
    store.mkdir(parents=True)
    (store / digest).write_bytes(config)
    raw = {
        "Id": f"sha256:{digest}",
        "RootFS": {"Layers": [f"sha256:{c * 64}" for c in "abc"]},
        "GraphDriver": {"Name": "overlay2", "Data": {"LowerDir": f"{l1}:{l0}", "UpperDir": str(l2)}},
    }
    monkeypatch.setattr(
        engine, "inspect_image", lambda ref: engine.ImageInfo(id=raw["Id"], size=1, labels={}, env={}, raw=raw)
    )
    monkeypatch.setattr(
        engine, "info", lambda: engine.EngineInfo(root_dir=str(tmp_path), driver="overlay2", runtimes=())
    )
    monkeypatch.setattr(engine, "save", lambda ref: pytest.fail("`docker save` although the folders can be read"))
    return raw, store / digest


def test_the_folders_list_what_the_layer_tars_list(data_root):
    scan = scan_layers("x:1", lambda path, size: path.startswith("etc/ssl/"))
    assert scan.source == "engine's overlay2 layer folders"
    assert scan.layers == [f"sha256:{c * 64}" for c in "abc"]
    assert scan.created_by == [h["created_by"] for h in HISTORY if not h.get("empty_layer")]
    got = {(f.layer, f.path): (f.kind, f.size, f.content, f.link) for f in scan.files}
    assert got[(0, "etc/ssl/cert.pem")] == ("file", 28, b"-----BEGIN CERTIFICATE-----\n", "")
    # a hard-linked pair: the first name in lexical order is the file, the other a link to it
    assert got[(0, "usr/bin/perl")] == ("file", 100, None, "")
    assert got[(0, "usr/bin/perl5.36")] == ("link", 0, None, "usr/bin/perl")
    assert got[(0, "usr/bin/perl-link")] == ("symlink", 0, None, "")
    assert got[(0, "fifo")] == ("other", 0, None, "")
    # overlayfs' whiteout and opaque directory, as the tar's .wh. names
    assert got[(2, "opt/t/.wh.gone")] == ("file", 0, None, "")
    assert got[(2, "opt/t/cache/.wh..wh..opq")] == ("file", 0, None, "")
    assert (2, "opt/t/gone") not in got
    # so the waste is what a save of the same layers gives: the deleted and the hidden file
    waste = layer_waste(scan)
    assert waste.total == 60 + 40 and {(w.path, w.how) for w in waste.top} == {
        ("opt/t/gone/f", "deleted"),
        ("opt/t/cache/old", "hidden"),
    }


def test_anything_but_the_engines_own_local_copy_falls_back_to_docker_save(data_root, monkeypatch):
    raw, config = data_root
    assert overlay_layers.layer_dirs("x:1") is not None
    monkeypatch.setenv("TRAINBASE_LAYER_SOURCE", "save")
    assert overlay_layers.layer_dirs("x:1") is None, "the save asked for by name"
    monkeypatch.delenv("TRAINBASE_LAYER_SOURCE")
    layers = raw["RootFS"]["Layers"]
    raw["RootFS"]["Layers"] = layers[:2]
    assert overlay_layers.layer_dirs("x:1") is None, "fewer layers than folders"
    raw["RootFS"]["Layers"] = layers
    config.write_bytes(config.read_bytes() + b" ")
    assert overlay_layers.layer_dirs("x:1") is None, "a config that is not the image's (its SHA-256 differs)"
    raw["GraphDriver"]["Name"] = "fuse-overlayfs"
    assert overlay_layers.layer_dirs("x:1") is None, "another storage driver"
    del raw["GraphDriver"]
    assert overlay_layers.layer_dirs("x:1") is None, "the containerd image store (no GraphDriver folders)"
