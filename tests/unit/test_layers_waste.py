"""trainbase_common.layers: the streaming of a `docker save` (both save layouts, built here as
real tar bytes and fed through a mocked engine.save) and the wasted bytes of the layers."""

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from trainbase_common import engine
from trainbase_common.layers import LayerFile, LayerScan, instruction, layer_waste, scan_layers, waste_share

MB = 1 << 20


# --------------------------------------------------------------------------- building saves


def _layer_tar(entries: list[tuple], gz: bool = False) -> bytes:
    """A layer tar from (name, kind, size_or_target) entries: kind file/dir/link/symlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, arg in entries:
            ti = tarfile.TarInfo(name)
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(ti)
            elif kind == "link":
                ti.type, ti.linkname = tarfile.LNKTYPE, arg
                tar.addfile(ti)
            elif kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
                tar.addfile(ti)
            else:
                data = arg if isinstance(arg, bytes) else b"x" * arg
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw) if gz else raw


# The image every save test uses: layer 1 writes, layers 2-4 delete, hide, overwrite.
HISTORY = [
    {"created_by": "/bin/sh -c #(nop) ADD file:abc in / "},
    {"created_by": "ENV A=b", "empty_layer": True},
    {"created_by": "RUN |2 CUDA=13.0 PY=3.12 /bin/sh -c apt-get update && apt-get install -y x # buildkit"},
    {"created_by": "RUN /bin/sh -c rm -rf /var/lib/apt/lists/* # buildkit"},
    {"created_by": "COPY big /opt/big # buildkit"},
]
LAYERS = [
    [
        ("etc", "dir", 0),
        ("etc/os-release", "file", b"ID=debian\n"),
        ("var/lib/apt/lists", "dir", 0),
        ("opt", "dir", 0),
        ("opt/big", "file", 3 * MB),
        ("opt/big.link", "link", "opt/big"),
        ("opt/shared", "file", 2 * MB),
        ("opt/shared.hard", "link", "opt/shared"),
        (".cache/pip/wheel", "file", 1000),
    ],
    [
        ("var/lib/apt/lists/debian_Packages", "file", 5 * MB),
        ("var/lib/apt/lists/partial", "dir", 0),
        ("var/lib/apt/lists/partial/x", "file", 7000),
        ("usr/share/doc/x/copyright", "file", 300),
    ],
    [
        ("var/lib/apt/lists/.wh..wh..opq", "file", 0),
        ("usr/share/.wh.doc", "file", 0),
        ("opt/.wh.shared", "file", 0),
        (".wh..cache", "file", 0),
    ],
    [("opt/big", "file", 4 * MB), ("opt/big.link", "symlink", "big"), ("etc", "dir", 0)],
]


def _config(extra: int = 0) -> bytes:
    history = HISTORY + [{"created_by": "COPY --from=base / /"}] * extra
    return json.dumps({"architecture": "amd64", "history": history}).encode()


def _outer(members: list[tuple[str, bytes | str]]) -> bytes:
    """The save tar: (name, bytes) for files, (name, "->target") for symlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            if isinstance(data, str):
                ti.type, ti.linkname = tarfile.SYMTYPE, data[2:]
                tar.addfile(ti)
            else:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def classic_save(repeat_bottom: bool = False) -> bytes:
    """`<id>/layer.tar` per layer, `<config>.json`; a layer repeated is a symlink to the first."""
    tars = [_layer_tar(e) for e in LAYERS]
    members: list[tuple[str, bytes | str]] = [("c0nf1g.json", _config(extra=int(repeat_bottom)))]
    order = []
    for i, t in enumerate(tars):
        members += [(f"l{i}/VERSION", b"1.0"), (f"l{i}/json", b"{}"), (f"l{i}/layer.tar", t)]
        order.append(f"l{i}/layer.tar")
    if repeat_bottom:
        members.append(("l9/layer.tar", "->../l0/layer.tar"))  # the bottom layer again, on top
        order.append("l9/layer.tar")
    manifest = [{"Config": "c0nf1g.json", "RepoTags": ["x:1"], "Layers": order}]
    return _outer([("manifest.json", json.dumps(manifest).encode())] + members)


def oci_save() -> bytes:
    """`blobs/sha256/<digest>` for config, manifests and layers (one gzipped); written before
    manifest.json, as the engine does; the small layers are smaller than 1 MiB, like a config."""
    blobs = [_layer_tar(e, gz=(i == 1)) for i, e in enumerate(LAYERS)]
    config = _config()
    names = {}
    members: list[tuple[str, bytes | str]] = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]
    for b in [config] + blobs:
        d = hashlib.sha256(b).hexdigest()
        names[id(b)] = f"blobs/sha256/{d}"
        members.append((f"blobs/sha256/{d}", b))
    members.append(("index.json", b'{"schemaVersion":2,"manifests":[]}'))
    manifest = [{"Config": names[id(config)], "RepoTags": ["x:1"], "Layers": [names[id(b)] for b in blobs]}]
    members.append(("manifest.json", json.dumps(manifest).encode()))
    return _outer(members)


@pytest.fixture
def saved(monkeypatch):
    """Point engine.save at a save built here (and not at the engine's layer folders); returns a setter."""
    from trainbase_common import overlay_layers

    monkeypatch.setattr(overlay_layers, "layer_dirs", lambda ref: None)

    def use(data: bytes):
        monkeypatch.setattr(engine, "save", lambda ref: io.BufferedReader(io.BytesIO(data)))
        monkeypatch.setattr(engine, "check_export_space", lambda ref: None)

    return use


def test_an_export_that_would_fill_the_disk_is_refused_naming_what_it_needs(monkeypatch, tmp_path):
    """The engine stages the whole export on its data root first: an 8 GB image with 5 GB
    free there is refused before the save starts, naming both numbers and the way out."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    image = engine.ImageInfo(id="sha256:" + "1" * 64, size=8_000_000_000, labels={}, env={}, raw={})
    facts = engine.EngineInfo(root_dir=str(tmp_path), driver="overlay2", runtimes=())
    # where each is looked up: check_export_space in its own module, the layer folders through engine
    for where in (engine, engine.export):
        monkeypatch.setattr(where, "inspect_image", lambda ref: image)
        monkeypatch.setattr(where, "info", lambda: facts)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(0, 0, 5_000_000_000))
    with pytest.raises(
        engine.EngineError,
        match=r"reading the layers of x:1 needs about 9.0 GB free under .*"
        r"5.0 GB free: prune",
    ):
        engine.check_export_space("x:1")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(0, 0, 9_500_000_000))
    engine.check_export_space("x:1")
    monkeypatch.setattr(engine, "save", lambda ref: pytest.fail("saved although it does not fit"))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(0, 0, 1))
    with pytest.raises(engine.EngineError):
        scan_layers("x:1", lambda path, size: False)


# --------------------------------------------------------------------------- streaming


def test_classic_save_lists_every_layer_in_order_with_history_and_asked_content(saved):
    saved(classic_save(repeat_bottom=True))
    scan = scan_layers("x:1", lambda path, size: path == "etc/os-release")
    assert scan.layers == ["l0/layer.tar", "l1/layer.tar", "l2/layer.tar", "l3/layer.tar", "l9/layer.tar"]
    assert len(scan.created_by) == 5  # the ENV step made no layer
    by = {(f.layer, f.path): f for f in scan.files}
    assert by[(0, "etc/os-release")].content == b"ID=debian\n"
    assert by[(0, "opt/big")].content is None and by[(0, "opt/big")].size == 3 * MB
    assert by[(0, "opt/big.link")].kind == "link" and by[(0, "opt/big.link")].link == "opt/big"
    assert by[(2, ".wh..cache")].kind == "file"  # a top-level whiteout keeps its leading dot
    assert (0, ".cache/pip/wheel") in by
    # the symlinked layer is the bottom one again, with its own layer number
    assert sorted(f.path for f in scan.files if f.layer == 4) == sorted(e[0] for e in LAYERS[0])


def test_oci_save_reads_small_and_gzipped_layers(saved):
    saved(oci_save())
    scan = scan_layers("x:1", lambda path, size: False)
    assert [sorted(f.path for f in scan.files if f.layer == i) for i in range(4)] == [
        sorted(e[0] for e in layer) for layer in LAYERS
    ]


def test_where_names_the_instruction_of_the_layer(saved):
    saved(classic_save())
    scan = scan_layers("x:1", lambda path, size: False)
    f = next(f for f in scan.files if f.path == "var/lib/apt/lists/debian_Packages")
    assert scan.where(f) == (
        "/var/lib/apt/lists/debian_Packages (layer 2/4: RUN apt-get update && apt-get install -y x)"
    )


@pytest.mark.parametrize(
    "created_by, shown",
    [
        ("/bin/sh -c #(nop)  ENV PATH=/usr/bin", "ENV PATH=/usr/bin"),
        ("|1 X=1 /bin/sh -c make", "RUN make"),
        ("RUN /bin/bash -o pipefail -c set -e; make # buildkit", "RUN set -e; make"),
        ("RUN /bin/sh -eux -c ls # buildkit", "RUN ls"),
        ("COPY a /b # buildkit", "COPY a /b"),
    ],
)
def test_instruction_reads_like_the_dockerfile(created_by, shown):
    assert instruction(created_by) == shown


def test_instruction_is_cut_to_its_width():
    assert instruction("RUN /bin/sh -c " + "x" * 200, width=20) == "RUN " + "x" * 13 + "..."


# --------------------------------------------------------------------------- wasted bytes


@pytest.mark.parametrize("save", [classic_save, oci_save])
def test_waste_of_a_real_save(saved, save):
    saved(save())
    waste = layer_waste(scan_layers("x:1", lambda path, size: False))
    top = {w.path: w for w in waste.top}
    # apt lists hidden by the opaque dir; docs deleted; old /opt/big (and its hard link) overwritten;
    # /opt/shared deleted but its bytes stay visible through its hard link; ~/.cache deleted.
    assert top["var/lib/apt/lists/debian_Packages"].how == "hidden"
    assert top["var/lib/apt/lists/partial/x"].by_layer == 2
    assert top["usr/share/doc/x/copyright"].how == "deleted"
    assert top["opt/big"].how == "overwritten" and top["opt/big"].layer == 0 and top["opt/big"].by_layer == 3
    assert top[".cache/pip/wheel"].size == 1000
    assert "opt/shared" not in top
    expected_l0 = 3 * MB + 1000
    expected_l1 = 5 * MB + 7000 + 300
    assert waste.per_layer == [expected_l0, expected_l1, 0, 0]
    assert waste.total == expected_l0 + expected_l1
    assert top["opt/big"].written_in.startswith("layer 1/")
    assert top["var/lib/apt/lists/debian_Packages"].removed_in.endswith("RUN rm -rf /var/lib/apt/lists/*")


def _scan(*layers: list[tuple]) -> LayerScan:
    """Layers of (path, kind, size); a hard link's third item is its target."""
    files = [
        LayerFile(layer=i, path=p, kind=k, size=0, link=s)
        if k == "link"
        else LayerFile(layer=i, path=p, kind=k, size=s)
        for i, entries in enumerate(layers)
        for p, k, s in entries
    ]
    return LayerScan(
        image="x",
        layers=[f"l{i}" for i in range(len(layers))],
        created_by=[f"RUN step{i}" for i in range(len(layers))],
        files=files,
    )


def test_no_waste_when_nothing_is_removed():
    waste = layer_waste(_scan([("a", "dir", 0), ("a/f", "file", 10)], [("a", "dir", 0), ("a/g", "file", 5)]))
    assert (waste.total, waste.per_layer, waste.top) == (0, [0, 0], [])


def test_whiteout_of_a_directory_wastes_everything_below_it():
    waste = layer_waste(
        _scan([("a/b/c", "file", 10), ("a/b/d/e", "file", 20), ("a/bb", "file", 40)], [("a/.wh.b", "file", 0)])
    )
    assert waste.total == 30  # a/bb shares the prefix, not the directory
    assert {w.path for w in waste.top} == {"a/b/c", "a/b/d/e"}
    assert all(w.removed_in == "layer 2/2: RUN step1" for w in waste.top)


def test_opaque_directory_hides_lower_layers_but_not_its_own():
    waste = layer_waste(
        _scan(
            [("d/old", "file", 100), ("d/sub/x", "file", 1), ("e", "file", 7)],
            [("d/.wh..wh..opq", "file", 0), ("d/new", "file", 50)],
            [("d/new", "file", 60)],
        )
    )
    assert waste.per_layer == [101, 50, 0]
    assert {(w.path, w.how) for w in waste.top} == {
        ("d/old", "hidden"),
        ("d/sub/x", "hidden"),
        ("d/new", "overwritten"),
    }


def test_whiteout_acts_on_lower_layers_only():
    waste = layer_waste(_scan([("x", "file", 3)], [("x", "file", 4), (".wh.x", "file", 0)]))
    assert waste.per_layer == [3, 0]


def test_a_file_over_a_directory_hides_the_directory_and_a_directory_over_a_file_overwrites_it():
    waste = layer_waste(_scan([("p/q", "file", 8), ("r", "file", 2)], [("p", "symlink", 0), ("r", "dir", 0)]))
    assert {(w.path, w.how, w.size) for w in waste.top} == {("p/q", "hidden", 8), ("r", "overwritten", 2)}


def test_hard_links_carry_no_bytes_and_keep_the_data_alive():
    waste = layer_waste(
        _scan(
            [("f", "file", 10), ("h", "link", "f"), ("g", "file", 5), ("k", "link", "g")],
            [(".wh.f", "file", 0), (".wh.k", "file", 0), (".wh.g", "file", 0)],
        )
    )
    assert waste.total == 5 and [w.path for w in waste.top] == ["g"]


def test_top_is_the_largest_n_and_total_counts_all():
    waste = layer_waste(
        _scan([(f"f{i}", "file", i + 1) for i in range(20)], [(f".wh.f{i}", "file", 0) for i in range(20)]), top=3
    )
    assert [w.path for w in waste.top] == ["f19", "f18", "f17"]
    assert waste.total == sum(range(1, 21))


def test_waste_share():
    waste = layer_waste(_scan([("f", "file", 30)], [("f", "file", 1)]))
    assert waste_share(waste, 1000) == pytest.approx(0.03)
    assert waste_share(waste, 0) == 0.0
