"""Integrity: what the image ships is whole. Every program and shared library it installs finds
every library it links against, and every installed Python distribution finds every
requirement it declares.

These catch what a check written for one component cannot: a slimming step that deleted a
library only some plugin or tool needs, a package removed or replaced under another that
depends on it. Nothing here is allowed to be "mostly" whole: the exceptions are listed in
trainbase_conformance/linkage.py, each pinned to the file, the missing library and the reason."""

from __future__ import annotations

import json
import posixpath
import shlex

import pytest

from trainbase_common.platforms import MACHINES as MACHINE  # OCI architecture -> uname -m in the image
from trainbase_conformance.emulation import ELF_MACHINE, image_arch
from trainbase_conformance.fixtures import PROBE_DIR
from trainbase_conformance.linkage import unexplained_gaps

# Where the image's own software lives: trainbase's prefixes (MPI, venv, tools), the CUDA
# toolkit, the distro programs, and the verbs providers and UCX modules (found by name, so the
# multiarch directory of any distro works).
ROOTS = (
    "/opt /usr/local /usr/bin /usr/sbin "
    "$(find /usr/lib /usr/lib64 -maxdepth 2 -type d \\( -name libibverbs -o -name ucx \\) 2>/dev/null)"
)


@pytest.mark.static
@pytest.mark.evidence("load")
def test_every_program_and_library_resolves_its_libraries(target):
    """Ask the dynamic linker (ldd, in the image's own environment) for every ELF program and
    shared library under the image's prefixes: none may link a library that resolves to
    nothing. A tool or plugin that cannot load is a broken image even if nothing else in the
    suite happens to run it."""
    scan = target.json_probe(f"{target.python} {PROBE_DIR}/unresolved_libs.py {ROOTS}", timeout=600)
    assert scan["scanned"] > 50, f"the scan found only {scan['scanned']} ELF files under {ROOTS}"
    gaps = unexplained_gaps(scan["unresolved"], scan["shipped"])
    lines = [f"{p}: {', '.join(libs)}" for p, libs in sorted(gaps.items())]
    assert not gaps, (
        f"{len(gaps)} of {scan['scanned']} programs/libraries link a library that is not in the "
        "image:\n" + "\n".join(lines[:40]) + ("\n..." if len(lines) > 40 else "")
    )


@pytest.mark.static
@pytest.mark.evidence("content")
def test_every_python_requirement_is_installed(target):
    """`pip check` in the image's Python: every installed distribution's declared requirements
    are installed at a version that satisfies them (a package removed or downgraded under
    another, e.g. by a later `pip install` in a child image, fails here, not at import time
    on the cluster)."""
    r = target.sh(f"{target.python} -m pip check --disable-pip-version-check", timeout=300)
    out = (r.stdout + r.stderr).strip()
    assert r.rc == 0, f"pip check in {target.python} exited {r.rc}:\n{out[-3000:]}"


@pytest.mark.static
@pytest.mark.evidence("content")
def test_every_binary_is_built_for_the_image_platform(target):
    """The image's platform (its config's architecture, and the manifest's platform where it
    declares one) is what every program and shared library under its prefixes is built for, and
    what the kernel reports inside it. An installer or tarball of the other architecture (the
    x86_64 Miniforge in an arm64 image) builds fine under emulation and dies with "exec format
    error" on the real node."""
    arch = image_arch(target.inspect)
    declared = target.manifest.get("platform")
    assert declared in (None, f"linux/{arch}"), f"the manifest says {declared}, the image config says linux/{arch}"
    scan = target.json_probe(
        f"{target.python} {PROBE_DIR}/elf_machines.py /opt /usr/local /usr/bin /usr/lib", timeout=600
    )
    assert scan["uname"] == MACHINE[arch], f"uname -m in the image is {scan['uname']}, the image is {arch}"
    want = str(ELF_MACHINE[arch])
    assert scan["counts"].get(want, 0) > 50, (
        f"only {scan['counts'].get(want, 0)} {arch} ELF files found: {scan['counts']}"
    )
    other = {m: n for m, n in scan["counts"].items() if m != want}
    assert not other, (
        f"{sum(other.values())} programs/libraries are built for another machine than {arch} "
        f"(ELF e_machine {', '.join(other)}), e.g. " + ", ".join(p for m in other for p in scan["samples"][m][:3])
    )


PYTHON_FACTS = (
    "import importlib.metadata as m, json, sys\n"
    "try:\n    mpi4py = m.version('mpi4py')\nexcept m.PackageNotFoundError:\n    mpi4py = None\n"
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'prefix': sys.prefix, 'mpi4py': mpi4py}))"
)


@pytest.mark.static
@pytest.mark.evidence("run")
def test_the_declared_python_runs(target):
    """The Python the image declares (PREFIX/bin/python, what every check runs its probes with)
    runs, is that prefix's own (sys.prefix: the venv or conda root, not a Python it happens to
    link), and is the declared version, with the declared mpi4py: what a training script
    started as PREFIX/bin/python gets. An expectations file's python.version and python.mpi4py
    are read here, where declared."""
    declared = target.components["python"]
    r = target.sh(f"{target.python} -c {shlex.quote(PYTHON_FACTS)}")
    assert r.rc == 0, f"the declared Python {target.python} does not run (exit {r.rc}): {r.stderr.strip()[-500:]}"
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    want = {k: declared[k] for k in ("prefix", "version", "mpi4py") if k in declared}
    got = {k: facts[k] for k in want}
    got["prefix"] = posixpath.normpath(got["prefix"])
    want["prefix"] = posixpath.normpath(want["prefix"])
    assert got == want, f"{target.python} is {got}, the image declares {want}"
