"""Libraries: which copy of a shared library a process gets must not be left to chance, and the
image must say which one it is. One copy of each shared library in the image (by soname), but
for those the manifest declares with a reason; and the labels name the NCCL, cuDNN and UCX that
really load -- after `import torch` in a framework image, through the dynamic linker in a base
image, through the MPI's own UCX component for UCX -- not merely some copy the image carries.

Duplicates a trainbase image is allowed are its manifest's ``duplicate_libraries`` (a foreign
image's expectations file's): ``[{"soname": "libucp.so.0", "reason": "...", "places": [GLOB, ...]}]``,
``places`` being where its copies may lie (shell patterns over each copy's path; a foreign
file may leave them out, and then any place goes), and ``in_loader_cache`` how many of them the
dynamic linker's cache may hold (default 1: a lookup by soname has one answer)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import pytest

from trainbase_conformance.fixtures import PROBE_DIR

# --------------------------------------------------------------------------- one copy of each


def undeclared_duplicates(duplicates: dict[str, list[dict[str, Any]]], declared: list[dict[str, str]]) -> list[str]:
    """One line per soname the image has as 2+ files and the manifest does not declare:
    ``libucp.so.0: /usr/lib/.../libucp.so.0.0.0 (1.0 MiB), /opt/.../libucp.so.0 (1020.1 KiB)``,
    ``libmpi.so.12: 4 identical copies: ...`` where the probe found the same bytes in each."""
    names = {d["soname"] for d in declared}
    return [
        f"{so}: {_copies(files)}" + ", ".join(f"{f['path']} ({_size(f['size'])})" for f in files)
        for so, files in sorted(duplicates.items())
        if so not in names
    ]


def _copies(files: list[dict[str, Any]]) -> str:
    """The prefix "N identical copies: " where the probe found the same bytes in every file."""
    digests = {f.get("sha256") for f in files}
    return f"{len(files)} identical copies: " if len(digests) == 1 and None not in digests else ""


def stale_declarations(duplicates: dict[str, list[dict[str, Any]]], declared: list[dict[str, Any]]) -> list[str]:
    """The declared duplicates the image does not have twice (a declaration left behind). An entry
    marked ``if_present`` is a family's rule rather than a measured find (conda's own runtime
    libraries beside the distro's: which of them a base image also has is the base's business),
    so its absence is not stale."""
    return [
        f"{d['soname']} ({d.get('reason', 'no reason given')})"
        for d in declared
        if d["soname"] not in duplicates and not d.get("if_present")
    ]


def misplaced_copies(duplicates: dict[str, list[dict[str, Any]]], declared: list[dict[str, Any]]) -> list[str]:
    """One line per copy of a declared soname that lies in none of the places its declaration
    names: a declaration allows the copies it was measured with, not one more put anywhere."""
    out = []
    for d in declared:
        places = d.get("places")
        if not places:
            continue  # a foreign expectations file that names no places: the soname alone
        for f in duplicates.get(d["soname"], []):
            if not any(fnmatchcase(f["path"], pattern) for pattern in places):
                out.append(f"{d['soname']}: {f['path']} is in none of the declared places ({', '.join(places)})")
    return out


def cached_copies(cache: dict[str, list[str]], declared: list[dict[str, Any]]) -> list[str]:
    """One line per declared soname of which the loader's cache holds more copies than its
    declaration allows (``in_loader_cache``, default 1): then which copy a process gets by
    soname depends on the order of the cache's folders (an ld.so.conf.d file sorting first)."""
    out = []
    for d in declared:
        listed = cache.get(d["soname"], [])
        allowed = int(d.get("in_loader_cache", 1))
        if len(listed) > allowed:
            out.append(
                f"{d['soname']}: the loader's cache (ldconfig -p) holds {len(listed)} copies, {allowed} declared; "
                f"a lookup by soname gets the first: {', '.join(listed)}"
            )
    return out


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@pytest.mark.static
@pytest.mark.evidence("content")
def test_one_copy_of_each_library(target):
    """Every shared library (ELF shared object, by its DT_SONAME) is in the image once:
    symlinks and hard links are one copy, a second file of the same soname is a second copy,
    whichever of them a process loads then depends on its library path, its RPATH or which
    package it imported first. Those the manifest declares under duplicate_libraries, each with
    its reason, are allowed -- in the places the declaration names, and no more of them in the
    loader's cache than it says; a declaration the image no longer needs fails too."""
    scan = target.json_probe(f"{target.python} {PROBE_DIR}/sonames.py /", timeout=300)
    assert scan["scanned"] > 50, f"the scan found only {scan['scanned']} shared libraries with a soname under /"
    declared = target.manifest.get("duplicate_libraries") or []
    twice = undeclared_duplicates(scan["duplicates"], declared)
    assert not twice, (
        f"{len(twice)} shared libraries are in the image more than once (remove the copy, or declare the "
        "soname with its reason under the manifest's duplicate_libraries):\n" + "\n".join(twice)
    )
    stale = stale_declarations(scan["duplicates"], declared)
    assert not stale, f"the manifest declares duplicate libraries the image has only once: {', '.join(stale)}"
    misplaced = misplaced_copies(scan["duplicates"], declared)
    assert not misplaced, (
        f"{len(misplaced)} cop(ies) of declared duplicate libraries lie outside the places their declaration "
        "names (a copy more, wherever it lies, is a copy the declaration was not measured with):\n"
        + "\n".join(misplaced)
    )
    # no loader cache at all (a musl image): every lookup goes by path, nothing to get wrong
    cached = cached_copies(scan.get("loader_cache") or {}, declared)
    assert not cached, "\n".join(cached)


# --------------------------------------------------------------------------- labels from what loads

# label -> (probe entry, the manifest's claim as a path into its components)
LOADED_LABELS = {
    "io.trainbase.nccl": ("nccl", ("nccl",)),
    "io.trainbase.cudnn": ("cudnn", ("cudnn",)),
    "io.trainbase.ucx": ("ucx", ("mpi", "ucx")),
}
FRAMEWORK_MODULES = {"pytorch": "torch", "tensorflow": "tensorflow"}


def _claim(components: dict[str, Any], path: tuple[str, ...]) -> str | None:
    """The manifest's version at ``path`` (components.mpi.ucx falls back to components.ucx: the
    image's UCX is the MPI's where the MPI bundles none)."""
    node: Any = components
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if node is None and path == ("mpi", "ucx"):
        node = components.get("ucx")
    return node.get("version") if isinstance(node, dict) else None


def same_version(claimed: str | None, loaded: str) -> bool:
    """A claim names the loaded version when its leading parts are the loaded ones: the label
    "9.10.2.21" names cuDNN "9.10.2" (cudnnGetVersion has no build number)."""
    want = loaded.split(".")
    return claimed is not None and claimed.split(".")[: len(want)] == want


def what_loads(labels: dict[str, str], components: dict[str, Any], probe: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per label: what the label and the manifest say, what loads (version, file, how
    it was found), and why they disagree (``problem``, "" where they agree; ``skip`` where the
    image has none of it, e.g. an MPI that links no UCX)."""
    rows = []
    for label, (name, path) in LOADED_LABELS.items():
        got = probe.get(name) or {"error": "not asked"}
        row = {
            "label": label,
            "labelled": labels.get(label),
            "manifest": _claim(components, path),
            "loaded": got.get("version"),
            "path": got.get("path"),
            "via": got.get("via"),
            "skip": got.get("absent", ""),
        }
        row["problem"] = _problem(row, got)
        rows.append(row)
    return rows


def _problem(row: dict[str, Any], got: dict[str, Any]) -> str:
    if row["skip"]:  # the MPI loads no UCX (Intel MPI without libfabric's mlx provider): nothing to name
        return ""
    if "error" in got or row["loaded"] is None:
        return f"does not load: {got.get('error', 'no version')}"
    if not same_version(row["labelled"], row["loaded"]):
        return f"labelled {row['labelled']}, loads {row['loaded']} ({row['path']})"
    if not same_version(row["manifest"], row["loaded"]):
        return f"the manifest says {row['manifest']}, loads {row['loaded']} ({row['path']})"
    return ""


def table(name: str, rows: list[dict[str, Any]]) -> str:
    """The rows on one line: ``IMAGE: label labelled=X loaded=Y (PATH via V); ...``."""
    cells = [
        f"{r['label']} labelled={r['labelled']} "
        + (f"n/a ({r['skip']})" if r["skip"] else f"loaded={r['loaded']} ({r['path']} via {r['via']})")
        for r in rows
    ]
    return f"{name}: " + "; ".join(cells)


def _probe_args(target) -> str:
    c = target.components
    cudnn_major = (c.get("cudnn") or {}).get("version", "9").split(".")[0]
    imports = [
        f"--import {m}" for fw, m in FRAMEWORK_MODULES.items() if fw in (target.manifest.get("frameworks") or {})
    ]
    mpi = c.get("mpi") or {}
    ucx = f"ucx={mpi.get('kind', 'none')}:{mpi.get('prefix') or '/usr'}"
    return " ".join([*imports, "nccl=libnccl.so.2", f"cudnn=libcudnn.so.{cudnn_major}", ucx])


@pytest.mark.static
@pytest.mark.evidence("load")
@pytest.mark.trainbase_contract("the io.trainbase.* labels")
def test_labels_name_what_loads(target):
    """io.trainbase.nccl, .cudnn and .ucx (and the manifest's nccl, cudnn and mpi.ucx) are the
    versions of the libraries a process of the image really loads: NCCL and cuDNN as the
    framework loads them (`import torch`; the dynamic linker in a base image), UCX as the MPI's
    own UCX user (Open MPI's pml ucx or libmpi, Intel MPI's libfabric mlx provider) resolves
    libucp.so.0; each version asked of that very file (ncclGetVersion, cudnnGetVersion,
    ucp_get_version). A label copied from the matrix while another copy is what loads fails."""
    probe = target.json_probe(f"{target.python} {PROBE_DIR}/loaded_libs.py {_probe_args(target)}", timeout=300)
    rows = what_loads(target.labels, target.components, probe)
    print(table(target.name, rows))
    wrong = [f"{r['label']}: {r['problem']}" for r in rows if r["problem"]]
    if "import" in probe:  # the framework did not import: what it loads is unknown
        wrong.insert(0, probe["import"])
    assert not wrong, "labels (or the manifest) that do not name what the image loads:\n" + "\n".join(wrong)
