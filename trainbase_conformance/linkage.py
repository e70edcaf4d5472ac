"""Which libraries an image's programs and shared libraries may link without the image carrying
them: the judgement behind test_integrity's linkage check, kept here so it is unit-tested.

Everything else a scanned file links and the dynamic linker cannot find is a broken image."""

from __future__ import annotations

import re

# The NVIDIA driver's user-space libraries are not in any image: the container toolkit mounts
# the host's at run time (`--gpus`), so a CUDA library may link them and be whole.
DRIVER_LIBRARY = re.compile(r"^lib(cuda|nvcuvid|nvoptix|nvidia-[\w.-]+)\.so(\.\d+)*$")

# Optional plugins for hardware or stacks no trainbase image targets, loaded only when selected:
# their absence changes nothing the image claims. One row each: the file (a regex on its path),
# the libraries it may miss (a regex on the soname), and why.
_GAP_ROWS = r"""
/site-packages/mpi4py/MPI\.\w+\.cpython-[^/]+\.so$ | ^libmpi(_abi)?\.so\.\d+$ | mpi4py 4.1 ships one extension per MPI ABI and opens the image's libmpi itself; test_mpi4py_linked_to_image_mpi proves the one that matters loads
/libpsmx2-fi\.so$ | ^libpsm2\.so\.\d+$ | libfabric's PSM2 provider is for Intel Omni-Path; libfabric skips a provider that does not load
/nvshmem_bootstrap_pmix\.so[.\d]*$ | ^libpmix\.so\.\d+$ | NVSHMEM's PMIx bootstrap, opened only with NVSHMEM_BOOTSTRAP=PMIX
/nvshmem_transport_libfabric\.so[.\d]*$ | ^libfabric\.so\.\d+$ | NVSHMEM's libfabric transport (Slingshot/EFA), opened only when selected
/nvshmem_bootstrap_(mpi|shmem)\.so[.\d]*$ | ^lib(mpi|oshmem)\.so\.40$ | NVSHMEM's Open MPI / OpenSHMEM bootstraps, opened only with NVSHMEM_BOOTSTRAP=MPI or SHMEM (PyTorch bootstraps NVSHMEM itself); they need Open MPI's libmpi.so.40 on the loader's path
/libmpi_ze_hooks\.so$ | ^libze_loader\.so\.\d+$ | Intel MPI's Level Zero hooks, for Intel GPUs
/libmpifort_abi\.so[.\d]*$ | ^libmpi_abi\.so\.\d+$ | Intel MPI's MPI-ABI Fortran bindings; impi-rt carries no MPI-ABI libmpi
/IMB-MT$ | ^libiomp5\.so$ | the multi-threaded Intel MPI Benchmarks need Intel's OpenMP runtime, not part of impi-rt
"""
EXPECTED_GAPS: list[tuple[re.Pattern[str], re.Pattern[str], str]] = [
    (re.compile(f), re.compile(lib), why)
    for f, lib, why in (tuple(c.strip() for c in row.split(" | ", 2)) for row in _GAP_ROWS.strip().splitlines())
]


SITE_PACKAGE = re.compile(r"^(.*/site-packages/[^/]+/)")


def loaded_first_by_its_package(path: str, soname: str, shipped: dict[str, list[str]]) -> bool:
    """A Python package's plugin or C++ extension may link its package's core library by bare
    name (triton's plugins: libtriton.so; a PyTorch extension: libc10.so, libtorch_cpu.so): the
    package, or `import torch`, loads that library first and the linker reuses it by soname.
    True when the image ships the library in that same package or in torch/lib."""
    pkg = SITE_PACKAGE.match(path)
    return pkg is not None and any(
        p.startswith(pkg.group(1)) or "/site-packages/torch/lib/" in p for p in shipped.get(soname, [])
    )


def unexplained_gaps(unresolved: dict[str, list[str]], shipped: dict[str, list[str]]) -> dict[str, list[str]]:
    """The missing libraries that neither the driver, an expected gap, nor a package that loads
    its own library first explains."""
    left = {}
    for path, sonames in unresolved.items():
        rest = [
            s
            for s in sonames
            if not DRIVER_LIBRARY.match(s)
            and not any(f.search(path) and lib.match(s) for f, lib, _ in EXPECTED_GAPS)
            and not loaded_first_by_its_package(path, s, shipped)
        ]
        if rest:
            left[path] = rest
    return left
