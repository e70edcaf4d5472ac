"""test_mpi.py's check of an Open MPI built on the distro's hwloc, libevent and PMIx (matrix.yaml
mpi system_libs, issue 72), judged on ompi_info's real output (tests/unit/fixtures/mpi_cuda/):
- ompi_info_4.1.4_system_libs.txt: the openmpi4.1.4 Debian 12 image built --with-hwloc=external
  --with-libevent=external --with-pmix=/usr/lib/x86_64-linux-gnu/pmix2 (event/hwloc external,
  pmix ext3x);
- ompi_info_4.1.4_embedded_libs.txt: the same cell as built before, on the tarball's own copies
  (libevent2022, hwloc201, pmix3x).
An image whose manifest says system_libs but whose Open MPI opens the embedded copies fails,
naming each library."""

from __future__ import annotations

import pytest

from trainbase_conformance.checks import test_mpi

from .test_mpi_cuda_checks import FakeImage, fixture

SYSTEM_LIBS = ["hwloc", "libevent", "pmix"]


def image(ompi_info: str, system_libs: list[str] | None) -> FakeImage:
    mpi = {"kind": "openmpi", "version": "4.1.4", "cuda_aware": True}
    if system_libs is not None:
        mpi["system_libs"] = system_libs
    fake = FakeImage(
        {"mpi": mpi}, {"OMPI_MCA_mca_base_component_show_load_errors=1 ompi_info --parsable": fixture(ompi_info)}
    )
    fake.name = "openmpi4.1.4-cuda12.8-cudnn9-debian12"
    return fake


def test_the_parser_reads_each_frameworks_components():
    comps = test_mpi.ompi_components(fixture("ompi_info_4.1.4_system_libs.txt"))
    assert comps["pmix"] == {"ext3x", "isolated", "flux"}
    assert comps["hwloc"] == {"external"} and comps["event"] == {"external"}


def test_an_open_mpi_on_the_distros_libraries_passes():
    test_mpi.test_ompi_uses_the_distro_libraries_the_manifest_names(
        image("ompi_info_4.1.4_system_libs.txt", SYSTEM_LIBS)
    )


def test_embedded_copies_under_a_manifest_that_names_the_distros_fail_naming_each():
    with pytest.raises(AssertionError) as e:
        test_mpi.test_ompi_uses_the_distro_libraries_the_manifest_names(
            image("ompi_info_4.1.4_embedded_libs.txt", SYSTEM_LIBS)
        )
    text = str(e.value)
    assert "hwloc: hwloc components ['hwloc201']" in text
    assert "libevent: event components ['libevent2022']" in text
    assert "pmix: pmix components ['flux', 'isolated', 'pmix3x']" in text


def test_an_open_mpi_without_system_libs_is_not_applicable():
    with pytest.raises(pytest.skip.Exception, match="compiles its own"):
        test_mpi.test_ompi_uses_the_distro_libraries_the_manifest_names(
            image("ompi_info_4.1.4_embedded_libs.txt", None)
        )


def test_an_ompi_info_that_does_not_run_fails_saying_so():
    fake = image("ompi_info_4.1.4_system_libs.txt", SYSTEM_LIBS)
    fake.answers = {"OMPI_MCA_mca_base_component_show_load_errors=1 ompi_info --parsable": (127, "")}
    with pytest.raises(AssertionError, match="ompi_info --parsable exited 127"):
        test_mpi.test_ompi_uses_the_distro_libraries_the_manifest_names(fake)
