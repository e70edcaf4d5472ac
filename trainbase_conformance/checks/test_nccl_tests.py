"""nccl-tests: the benchmarks the manifest declares are there, resolve the image's one NCCL and
its own MPI, run their argument parsing, and on a GPU node run a collective correctly (issue 70).

A fabric's bring-up is judged by all_reduce_perf: users run it on a new node before any job, and
NGC's and AWS's images carry it. What an image can get wrong without a GPU to show it: a binary
missing, linked to a second NCCL (a copy nccl-tests brought, or another one the loader finds
first, so the figures are another NCCL's), built without MPI (one process per node only), or
against another MPI than the image's mpirun starts. Expectations come from the manifest's
components.nccl_tests."""

import re
import shlex

import pytest

from trainbase_conformance.checks.test_libfabric import declared
from trainbase_conformance.checks.test_nccl import _nccl, nccl_version_code

LABEL = "io.trainbase.nccl-tests"


def resolved(ldd_out: str) -> dict[str, str]:
    """`ldd`'s answer as soname -> the file it resolves to ("not found" where none)."""
    out = {}
    for ln in ldd_out.splitlines():
        m = re.match(r"\s*(\S+) => (not found|\S+)", ln)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@pytest.mark.static
@pytest.mark.evidence("load")
def test_nccl_tests_resolve_the_images_one_nccl_and_its_mpi(target):
    """Each declared binary is there and `ldd` resolves every library it needs inside the image:
    libnccl.so.2 to the file the image's own loader gives (its one NCCL), libmpi to the image's MPI
    (a build without MPI=1 needs none, and runs one process per node); the label names the release."""
    tests = declared(target, "nccl_tests")
    nccl = _nccl(target)
    assert "error" not in nccl, f"libnccl.so.2 does not load: {nccl['error']}"
    nccl_file = target.sh(f"readlink -f {shlex.quote(nccl['path'])}").stdout.strip()
    mpi_prefix = target.components["mpi"].get("prefix")
    for b in tests["binaries"]:
        r = target.sh(f"ldd {shlex.quote(b)}")
        assert r.rc == 0, f"{b}: ldd exited {r.rc}: {(r.stderr or r.stdout).strip()[-300:]}"
        libs = resolved(r.stdout)
        missing = sorted(s for s, path in libs.items() if path == "not found")
        assert not missing, f"{b} needs {missing}, which resolve to nothing in the image"
        assert "libnccl.so.2" in libs, f"{b} does not link libnccl.so.2: {sorted(libs)}"
        got = target.sh(f"readlink -f {shlex.quote(libs['libnccl.so.2'])}").stdout.strip()
        assert got == nccl_file, (
            f"{b} loads NCCL from {got}, the image's NCCL is {nccl_file}: a second NCCL, so its figures "
            "are not the ones a job gets"
        )
        mpi = sorted(s for s in libs if s.startswith("libmpi.so"))
        assert mpi, f"{b} links no libmpi: built without MPI=1, it runs one process per node, never across nodes"
        if mpi_prefix:
            where = target.sh(f"readlink -f {shlex.quote(libs[mpi[0]])}").stdout.strip()
            assert where.startswith(mpi_prefix.rstrip("/") + "/"), (
                f"{b} loads {mpi[0]} from {where}, not from the image's MPI ({mpi_prefix}): mpirun would start "
                "ranks of another MPI"
            )
    if not target.foreign:
        assert target.labels.get(LABEL) == tests["version"], (
            f"{LABEL} is {target.labels.get(LABEL)}, the manifest says {tests['version']}"
        )


VERSION_LINE = re.compile(r"# nccl-tests version (\S+) nccl-headers=(\d+) nccl-library=(\d+)")


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_nccl_tests_parse_their_arguments_and_start_on_the_declared_nccl(target):
    """Each declared binary runs its argument parsing (`-h` prints its usage; it loads
    libnccl.so.2 and asks its version first, no GPU needed), and all_reduce_perf started as a job
    starts it, under the image's mpirun with 2 ranks, gets through MPI_Init and prints its version
    line once (rank 0) before it looks for GPUs: the release the manifest declares, built with the declared
    NCCL's headers and running the declared NCCL's library (a CPU host then stops at CUDA)."""
    tests = declared(target, "nccl_tests")
    for b in tests["binaries"]:
        r = target.sh(f"{shlex.quote(b)} -h")
        out = r.stdout + r.stderr
        assert r.rc == 0, f"{b} -h exited {r.rc}: {out.strip()[-300:]}"
        assert "USAGE:" in out and "--minbytes" in out and "--ngpus" in out, (
            f"{b} -h printed no nccl-tests usage: {out.strip()[-300:]}"
        )
    binary = next(b for b in tests["binaries"] if b.endswith("/all_reduce_perf"))
    launcher = "mpirun -np 2" if target.components["mpi"]["kind"] == "openmpi" else "mpiexec -n 2"
    r = target.sh(f"{launcher} {shlex.quote(binary)} -b 8 -e 8 -g 1 2>&1", timeout=180)
    lines = VERSION_LINE.findall(r.stdout)
    m = VERSION_LINE.search(r.stdout)
    assert m, f"all_reduce_perf under {launcher} printed no version line (exit {r.rc}): {r.stdout.strip()[-600:]}"
    # rank 0 prints it; a binary built without MPI=1 runs each rank as a world of its own, and each prints it
    assert len(lines) == 1, (
        f"all_reduce_perf under {launcher} printed its version line {len(lines)} times: each rank ran as a "
        "world of its own (built without MPI=1, or against another MPI than this launcher's)"
    )
    want = nccl_version_code(target.components["nccl"]["version"])
    assert m.group(1) == tests["version"], f"{binary} is nccl-tests {m.group(1)}, the manifest says {tests['version']}"
    assert (int(m.group(2)), int(m.group(3))) == (want, want), (
        f"{binary} was built with NCCL {m.group(2)}'s headers and runs NCCL {m.group(3)}, the image declares "
        f"{target.components['nccl']['version']} ({want})"
    )


# "#       8             2     float     sum      -1    12.34    0.00    0.00      0 ..."; the
# last lines: "# Out of bounds values : 0 OK" and "# Avg bus bandwidth    : 123.4"
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|N/A)", re.M)


def perf_rows(out: str) -> list[dict]:
    """all_reduce_perf's out-of-place rows: size, time (us), algbw, busbw (GB/s), #wrong."""
    return [
        {
            "bytes": int(m.group(1)),
            "time_us": float(m.group(6)),
            "algbw": float(m.group(7)),
            "busbw": float(m.group(8)),
            "wrong": m.group(9),
        }
        for m in ROW.finditer(out)
    ]


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_all_reduce_perf_runs_correctly_on_the_nodes_gpus(target, record_property):
    """all_reduce_perf on the node's GPUs (one process, -g N; 8 B to 64 MiB) runs with the image's NCCL (the version line names
    the library and the headers it was built with, both the declared one), checks every result
    (#wrong 0 on every row), and its figures are recorded; with NCCL_DEBUG=INFO NCCL's log shows
    the network it chose, so a plugin that took a node without its fabric is seen."""
    tests = declared(target, "nccl_tests")
    binary = next(b for b in tests["binaries"] if b.endswith("/all_reduce_perf"))
    gpus = max(1, target.caps.gpu_count)
    r = target.sh(f"NCCL_DEBUG=INFO {shlex.quote(binary)} -b 8 -e 64M -f 4 -g {gpus} -c 1", timeout=300)
    out = r.stdout + r.stderr
    assert r.rc == 0, f"all_reduce_perf exited {r.rc}: {out.strip()[-600:]}"
    want = nccl_version_code(target.components["nccl"]["version"])
    m = VERSION_LINE.search(out)
    assert m, f"all_reduce_perf printed no version line: {out.strip()[-300:]}"
    assert int(m.group(3)) == want and int(m.group(2)) == want, (
        f"all_reduce_perf was built with NCCL {m.group(2)} and runs {m.group(3)}, the image declares {want}"
    )
    rows = perf_rows(out)
    assert rows, f"all_reduce_perf printed no result rows: {out.strip()[-600:]}"
    wrong = [row for row in rows if row["wrong"] not in ("0", "N/A")]
    assert not wrong, f"all_reduce_perf found wrong results: {wrong}"
    record_property("all_reduce_perf", rows[-1])
    if "nccl_net_plugin" in target.components:
        assert re.search(r"NET/(IB|Socket)", out), (
            f"on a node without EFA NCCL should keep its own IB or socket network, its log says: "
            f"{[ln for ln in out.splitlines() if 'NET/' in ln][:5]}"
        )
