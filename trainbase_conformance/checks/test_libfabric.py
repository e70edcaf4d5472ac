"""libfabric: the image's libfabric is the declared release, carries the declared providers, and
its CUDA support finds the image's cudart (issue 70).

NCCL's OFI plugin and Open MPI's OFI MTL open it; on an AWS EFA node they need its efa provider,
and for GPU buffers its FI_HMEM CUDA support, which libfabric dlopens at run time by the
unversioned name libcudart.so. None of that needs the hardware to show: the providers a build
carries are listed by `fi_info -l` on any node, and the CUDA runtime is dlopened (and its absence
logged) when libfabric initialises, before any device is asked. Expectations come from the
manifest's components.libfabric."""

import re

import pytest

LABEL = "io.trainbase.libfabric"
# libfabric's name for a utility provider layered on a core one (rxm over verbs or tcp)
UTIL_PREFIX = "ofi_"


def declared(target, key):
    """The claim of ``key``: on an image with an expectations file, an undeclared one is skipped
    where the image holds none and failed where it holds one (target.require); on a trainbase
    image whose cell carries none (matrix.yaml fabric: its platforms, IB row and MPI), n/a. A PyPI
    MPI's own libfabric there is the MPI's (test_mpi, test_libraries check it)."""
    target.require(key)
    if key not in target.components:
        pytest.skip(f"n/a: {target.name}'s cell carries no {key} (matrix.yaml fabric)")
    return target.components[key]


def listed_providers(out: str) -> set[str]:
    """The providers `fi_info -l` lists ("efa:", "ofi_rxm:" ... a line each, versions indented),
    utility providers by their matrix name (ofi_rxm -> rxm)."""
    names = {m.group(1) for m in re.finditer(r"^([a-z0-9_]+):\s*$", out, re.M)}
    return {n.removeprefix(UTIL_PREFIX) for n in names}


@pytest.mark.static
@pytest.mark.evidence("run")
def test_libfabric_is_the_declared_release_with_its_providers(target):
    """`fi_info --version` (the library it loads) reports the manifest's release, `fi_info -l`
    lists every declared provider, and the io.trainbase.libfabric label names the release."""
    lf = declared(target, "libfabric")
    fi_info = f"{lf['prefix']}/bin/fi_info" if "prefix" in lf else "fi_info"
    r = target.sh(f"{fi_info} --version")
    assert r.rc == 0, f"`{fi_info} --version` exited {r.rc}: {(r.stderr or r.stdout).strip()[-400:]}"
    m = re.search(r"libfabric:\s*([0-9][0-9.]*)", r.stdout)
    assert m, f"`fi_info --version` names no libfabric release: {r.stdout.strip()[:300]}"
    assert m.group(1) == lf["version"], (
        f"the manifest says libfabric {lf['version']}, the loaded library is {m.group(1)}"
    )
    r = target.sh(f"{fi_info} -l")
    assert r.rc == 0, f"`{fi_info} -l` exited {r.rc}: {(r.stderr or r.stdout).strip()[-400:]}"
    missing = sorted(set(lf["providers"]) - listed_providers(r.stdout))
    assert not missing, (
        f"libfabric {m.group(1)} lacks the declared providers {missing} (fi_info -l lists "
        f"{sorted(listed_providers(r.stdout))}): an EFA node without efa runs NCCL and MPI over TCP"
    )
    if not target.foreign:
        assert target.labels.get(LABEL) == m.group(1), (
            f"{LABEL} is {target.labels.get(LABEL)}, libfabric is {m.group(1)}"
        )


@pytest.mark.static
@pytest.mark.evidence("run")
def test_libfabric_cuda_support_finds_the_images_cudart(target):
    """libfabric's CUDA support (FI_HMEM: GPU buffers over EFA) dlopens "libcudart.so" when it
    initialises; where that name resolves to nothing it logs "Failed to dlopen libcudart.so" and
    runs host memory only. With FI_LOG_LEVEL=info, `fi_info -l` shows which: here the runtime must
    open, so what follows is its driver (absent on a node without a GPU, which is fine)."""
    lf = declared(target, "libfabric")
    fi_info = f"{lf['prefix']}/bin/fi_info" if "prefix" in lf else "fi_info"
    r = target.sh(f"FI_LOG_LEVEL=info FI_LOG_SUBSYS=core {fi_info} -l 2>&1")
    assert r.rc == 0, f"`{fi_info} -l` exited {r.rc}: {r.stdout.strip()[-400:]}"
    assert "Failed to dlopen libcudart.so" not in r.stdout, (
        "libfabric's CUDA support cannot dlopen libcudart.so (its unversioned name): FI_HMEM is off and "
        "EFA takes no GPU buffers; " + next((ln for ln in r.stdout.splitlines() if "libcudart" in ln), "")
    )
