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
    return SimpleNamespace(name="openmpi4.1.4-cuda12.8-cudnn9-debian12", cache={},
                           labels={"io.trainbase.sbom": SBOM,
                                   "io.trainbase.sbom.sha256": hashlib.sha256(text.encode()).hexdigest()},
                           container=SimpleNamespace(read=lambda path: text if path == SBOM else ""))


def test_an_sbom_of_another_image_fails_though_its_digest_matches():
    """Copied from another cell's build (the label recomputed for the copy): intact, and not this image's."""
    with pytest.raises(AssertionError, match=r"the SBOM describes 'intelmpi2021\.18-cuda12\.8-cudnn9-debian12', not this image"):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(_sbom_target("intelmpi2021.18-cuda12.8-cudnn9-debian12"))
    with pytest.raises(AssertionError, match=r"not a CycloneDX 1\.x document: bomFormat 'SPDX'"):
        test_supply_chain.test_image_carries_its_cyclonedx_sbom(_sbom_target("x", fmt="SPDX"))
    test_supply_chain.test_image_carries_its_cyclonedx_sbom(_sbom_target("openmpi4.1.4-cuda12.8-cudnn9-debian12"))


def _devel_target(rc: int, stdout: str, stderr: str = ""):
    return SimpleNamespace(components={"cuda": {"from": "base", "version": "12.8"}},
                           sh=lambda cmd, timeout=None: SimpleNamespace(rc=rc, stdout=stdout, stderr=stderr))


def test_a_devel_image_without_nvcc_fails():
    with pytest.raises(AssertionError, match=r"nvcc missing in a devel image: sh: 1: nvcc: not found"):
        test_cuda.test_nvcc_in_devel_image(_devel_target(127, "", "sh: 1: nvcc: not found"))
    with pytest.raises(AssertionError, match=r"nvcc is not CUDA 12\.8"):
        test_cuda.test_nvcc_in_devel_image(_devel_target(0, "Cuda compilation tools, release 12.4, V12.4.131"))
    test_cuda.test_nvcc_in_devel_image(_devel_target(0, "Cuda compilation tools, release 12.8, V12.8.93"))
