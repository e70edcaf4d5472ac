"""MPI: Open MPI (the distro's, a wheel, or built from the pinned source) or Intel MPI (wheels),
and whether it takes CUDA buffers."""

from __future__ import annotations

from typing import Any

from .cuda import runtime_tree
from .facts import Block, Facts
from .libfabric import LIBFABRIC_PREFIX
from .ucx import cuda_transports

OPENMPI_PREFIX = "/opt/openmpi"


def cuda_support(f: Facts) -> dict[str, Any]:
    """Whether the image's MPI takes CUDA buffers, and for Open MPI built here the --with-cuda
    directory. Open MPI 4.1/5.0 compile against cuda.h only and dlopen the driver's libcuda.so.1
    at run time, so the CUDA runtime wheel's headers suffice (no libcuda stub)."""
    kind, install = f.mpir.kind, f.mpir.install
    if kind == "openmpi" and install == "source":
        with_cuda = "/usr/local/cuda" if f.build_has_cuda else runtime_tree(f)
        why = f"Open MPI configured --with-cuda={with_cuda} (cuda.h; the driver's libcuda.so.1 is loaded at run time)"
        if not cuda_transports(f):
            # ob1 (what runs without an RDMA device) stages device buffers itself; UCX cannot
            why += (
                "; its UCX has no CUDA transports, so CUDA buffers take ob1 (smcuda within a node, "
                "TCP or verbs between nodes): on RDMA hosts, where pml ucx selects itself, run them with --mca pml ob1"
            )
        return {"aware": True, "with_cuda": with_cuda, "why": why}
    if kind == "openmpi":
        return {
            "aware": False,
            "with_cuda": None,
            "why": "the mpi4py project's Open MPI wheel is configured --without-cuda --disable-dlopen "
            "(ompi_info's Configure command line): no CUDA buffers without rebuilding it",
        }
    return {
        "aware": False,
        "with_cuda": None,
        "why": f"{kind} has no build-time CUDA support to check: Intel MPI's GPU buffer path is "
        "chosen at run time (I_MPI_OFFLOAD=1), which this image does not set",
    }


# The distro packages (distro_packages keys) of each library Open MPI can take from the distro
# instead of compiling its embedded copy (matrix.yaml mpi.*.system_libs): to compile, to run.
SYSTEM_LIB_PACKAGES = {
    "hwloc": (["hwloc-dev"], ["hwloc-runtime"]),
    "libevent": (["libevent-dev"], ["libevent-core-runtime", "libevent-pthreads-runtime"]),
    "pmix": (["pmix-dev"], ["pmix-runtime"]),
}


def ofi_prefix(f: Facts) -> str | None:
    """The libfabric Open MPI compiled here is built --with-ofi against (its OFI MTL), where the
    cell carries one. Not before 4.1.7: the 4.1 series' OFI MTL compiles against libfabric 2.x from
    4.1.7 on (4.1.4's mtl_ofi_request.h fails against 2.6.0, "expected expression before
    'struct'", seen here); such a cell's NCCL still takes the plugin, its MPI stays on TCP on EFA."""
    mpir = f.mpir
    if mpir.kind != "openmpi" or mpir.install != "source":
        return None
    if "libfabric" not in f.spec.fabric.on(f.cell.platform, f.ibr.providers, mpir.install):
        return None
    version = tuple(int(x) for x in mpir.version.split(".")[:3])
    return LIBFABRIC_PREFIX if version >= (4, 1, 7) else None


def block(f: Facts) -> Block:
    mpir = f.mpir
    lock = f.lock(f"{f.cell.mpi}-{f.python_tag}", mpir.packages) if mpir.install == "pypi" else None
    return Block(
        {
            "key": f.cell.mpi,
            "kind": mpir.kind,
            "version": mpir.version,
            "install": mpir.install,
            "series": ".".join(mpir.version.split(".")[:2]),
            "artifact": f.artifact(mpir.artifact),
            "lock": lock.path if lock else None,
            "prefix": OPENMPI_PREFIX if mpir.install == "source" else f.python_prefix,
            "cuda": cuda_support(f),
            "ofi": ofi_prefix(f),
            "system_libs": list(mpir.system_libs),
            "system_lib_dev": [p for lib in mpir.system_libs for p in SYSTEM_LIB_PACKAGES[lib][0]],
            "system_lib_runtime": [p for lib in mpir.system_libs for p in SYSTEM_LIB_PACKAGES[lib][1]],
        },
        locks=(lock,) if lock else (),
        artifacts=(mpir.artifact,) if mpir.artifact else (),
    )
