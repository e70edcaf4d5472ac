"""nccl-tests in the recipes (matrix.yaml fabric.nccl_tests, components/nccl_tests.py,
templates/blocks/nccl_tests.j2): which cells carry it, what nvcc builds it, what it links, and
what the manifest claims (issue 70)."""

from __future__ import annotations

import pytest
import yaml

from trainbase.define.matrix import load
from trainbase.render.context import build

from .conftest import ROOT

NCCL_TESTS_STEP = "# --- block: nccl_tests"


def dockerfile(name: str) -> str:
    return (ROOT / "images" / name / "Dockerfile").read_text()


@pytest.fixture(scope="module")
def m():
    return load(ROOT / "matrix.yaml")


def test_a_cuda_13_wheel_row_builds_it_with_the_compiler_wheels_in_a_scratch_folder(m):
    text = dockerfile("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    step = text[text.index(NCCL_TESTS_STEP) :]
    assert "tb-pip-install --target /tmp/nccl-tests-wheels /tmp/locks/cuda13.0-compiler-py3.11.txt" in step
    # the compiler wheels leave with the step: nothing installed into the image's environment
    assert "rm -rf /tmp/nccl-tests-src /tmp/nccl-tests-lib /tmp/nccl-tests-build /tmp/nccl-tests-wheels" in step
    assert "MPI=1 MPI_HOME=/opt/trainbase/venv" in step and "--cudart shared" in step
    assert 'NVCC_GENCODE="-gencode=arch=compute_80,code=compute_80 -gencode=arch=compute_90,code=compute_90"' in step
    assert "ENV PATH=/opt/nccl-tests/build:$PATH" in step
    ctx = build(m, m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12"))
    claim = ctx.manifest["components"]["nccl_tests"]
    assert claim["binaries"][0] == "/opt/nccl-tests/build/all_reduce_perf" and claim["mpi"] is True
    assert "nccl-tests-2.19.6" in ctx.sources


def test_a_source_built_open_mpi_is_what_it_links_and_intel_mpi_its_wheel(m):
    intel = build(m, m.cell("intelmpi2021.18-cuda13.2-cudnn9-debian12")).data["nccl_tests"]
    assert intel["mpi_home"] == "/opt/trainbase/venv"
    ubuntu = build(m, m.cell("openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04")).data["nccl_tests"]
    assert ubuntu["mpi_home"] == "/opt/openmpi"


def test_a_cuda_12_wheel_row_has_no_nvcc_and_no_nccl_tests(m):
    """NVIDIA's cu12 nvcc wheel carries ptxas, not the nvcc driver: the CUDA 12 Debian cells carry
    no nccl-tests, and their manifest claims none."""
    for name in ("openmpi4.1.4-cuda12.8-cudnn9-debian12", "intelmpi2021.18-cuda12.8-cudnn9-debian12"):
        assert NCCL_TESTS_STEP not in dockerfile(name)
        assert "nccl_tests" not in build(m, m.cell(name)).manifest["components"]


def test_an_ubuntu_row_mounts_the_toolchains_toolkit_and_copies_none_of_it(m):
    """The Ubuntu rows' nvcc is the CUDA devel toolchain stage's, bind-mounted into the one step
    (its versioned folder: /usr/local/cuda is a link through /etc/alternatives); a cell that
    compiles nothing else (DOCA's UCX and Intel MPI) gets the toolchain stage for it."""
    text = dockerfile("intelmpi2021.18-doca3.2-cuda12.8-cudnn9-ubuntu24.04")
    assert "AS toolchain" in text
    step = text[text.index(NCCL_TESTS_STEP) :]
    assert "--mount=type=bind,from=toolchain,source=/usr/local/cuda-12.8,target=/tmp/nccl-tests-cuda" in step
    assert "tb-pip-install --target" not in step
    assert "COPY --from=toolchain" not in text


def test_the_arm64_cells_carry_none(m):
    assert NCCL_TESTS_STEP not in dockerfile("openmpi5.0.11-cuda13.0-cudnn9-debian12-arm64")


def test_a_ptx_architecture_the_row_does_not_target_is_refused_naming_the_cell(tmp_path):
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["fabric"]["nccl_tests"]["ptx"] = ["7.0"]
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data))
    for p in ("patches", "locks"):
        (tmp_path / p).symlink_to(ROOT / p)
    m2 = load(tmp_path / "matrix.yaml")
    with pytest.raises(
        ValueError, match=r"openmpi5\.0\.11-cuda13\.0-cudnn9-debian12: fabric\.nccl_tests\.ptx \['7\.0'\]"
    ):
        build(m2, m2.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12"))


def test_binaries_that_are_not_perf_names_are_refused():
    from trainbase.define.schema import NcclTests

    with pytest.raises(ValueError, match=r"binaries \['all_reduce'\] are not nccl-tests' <collective>_perf names"):
        NcclTests(version="2.19.6", source="nccl-tests-2.19.6", binaries=["all_reduce"], ptx=["8.0"], platforms=[])
