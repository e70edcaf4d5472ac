"""Two static checks judged on fake image answers, so their failures are shown on every unit
run: an SBOM that is intact (its label's digest matches) but describes another image, and a
devel image (CUDA from the NVIDIA devel base) without nvcc; the honest answers pass."""

import hashlib
import json
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_cuda, test_supply_chain

SBOM = "/opt/trainbase/sbom.cdx.json"


def _sbom_target(about: str, fmt: str = "CycloneDX"):
    text = json.dumps({"bomFormat": fmt, "specVersion": "1.6", "metadata": {"component": {"name": about}}})
    return SimpleNamespace(
        name="openmpi4.1.4-cuda12.8-cudnn9-debian12",
        foreign=False,
        cache={},
        labels={"io.trainbase.sbom": SBOM, "io.trainbase.sbom.sha256": hashlib.sha256(text.encode()).hexdigest()},
        container=SimpleNamespace(read=lambda path: text if path == SBOM else ""),
    )


def test_an_sbom_of_another_image_fails_though_its_digest_matches():
    """Copied from another cell's build (the label recomputed for the copy): intact, and not this image's."""
    with pytest.raises(
        AssertionError, match=r"the SBOM describes 'intelmpi2021\.18-cuda12\.8-cudnn9-debian12', not this image"
    ):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(
            _sbom_target("intelmpi2021.18-cuda12.8-cudnn9-debian12")
        )
    with pytest.raises(AssertionError, match=r"not a CycloneDX 1\.x document: bomFormat 'SPDX'"):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(_sbom_target("x", fmt="SPDX"))
    test_supply_chain.test_image_carries_its_cyclonedx_sbom(_sbom_target("openmpi4.1.4-cuda12.8-cudnn9-debian12"))


def _devel_target(rc: int, stdout: str, stderr: str = ""):
    return SimpleNamespace(
        components={"cuda": {"from": "base", "version": "12.8"}},
        sh=lambda cmd, timeout=None: SimpleNamespace(rc=rc, stdout=stdout, stderr=stderr),
    )


def test_a_devel_image_without_nvcc_fails():
    with pytest.raises(AssertionError, match=r"nvcc missing in a devel image: sh: 1: nvcc: not found"):
        test_cuda.test_nvcc_in_devel_image(_devel_target(127, "", "sh: 1: nvcc: not found"))
    with pytest.raises(AssertionError, match=r"nvcc is not CUDA 12\.8"):
        test_cuda.test_nvcc_in_devel_image(_devel_target(0, "Cuda compilation tools, release 12.4, V12.4.131"))
    test_cuda.test_nvcc_in_devel_image(_devel_target(0, "Cuda compilation tools, release 12.8, V12.8.93"))


def test_an_image_without_the_sbom_labels_fails():
    """Built by a recipe that dropped the SBOM stage: no io.trainbase.sbom labels to find it by."""
    target = _sbom_target("openmpi4.1.4-cuda12.8-cudnn9-debian12")
    target.labels = {"org.opencontainers.image.revision": "0" * 40}
    with pytest.raises(
        AssertionError,
        match=r"no io\.trainbase\.sbom / \.sha256 labels: "
        r"\['org\.opencontainers\.image\.revision'\]",
    ):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(target)


def test_an_sbom_whose_digest_differs_from_its_label_fails():
    """The SBOM file rewritten after the build (a later layer's package install regenerated it):
    it still names this image, but it is not the one the label vouches for."""
    target = _sbom_target("openmpi4.1.4-cuda12.8-cudnn9-debian12")
    target.labels["io.trainbase.sbom.sha256"] = hashlib.sha256(b"the SBOM the build wrote").hexdigest()
    with pytest.raises(AssertionError, match=r"/opt/trainbase/sbom\.cdx\.json does not match its label's digest"):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(target)


def test_a_devel_image_whose_nvcc_cannot_build_a_kernel_fails():
    """nvcc of the right CUDA, with a host gcc newer than it accepts (a distro upgrade of gcc):
    `nvcc --version` passes, the first compile a job makes does not."""

    def sh(cmd, timeout=None):
        if "--version" in cmd:
            return SimpleNamespace(rc=0, stdout="Cuda compilation tools, release 12.8, V12.8.93", stderr="")
        return SimpleNamespace(
            rc=1,
            stdout="",
            stderr="/usr/local/cuda/bin/../targets/x86_64-linux/include/crt/"
            "host_config.h:143:2: error: #error -- unsupported GNU version! gcc versions later "
            "than 14 are not supported!",
        )

    target = SimpleNamespace(components={"cuda": {"from": "base", "version": "12.8"}}, sh=sh)
    with pytest.raises(
        AssertionError, match=r"nvcc could not build and run a kernel program: .*unsupported GNU version"
    ):
        test_cuda.test_nvcc_in_devel_image(target)
