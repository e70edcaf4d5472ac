"""libfabric with the providers matrix.yaml's fabric.libfabric names, from its pinned source, on
the platforms it lists: what NCCL's OFI plugin (nccl_net_plugin) and Open MPI's OFI MTL open.
Built with CUDA dlopened (FI_HMEM: GPU buffers over EFA) and GDRCopy, as AWS's EFA installer
builds it, so it loads on a node without the driver and finds CUDA where there is one."""

from __future__ import annotations

from .cuda import runtime_tree
from .facts import Block, Facts
from .gdrcopy import GDRCOPY_PREFIX

# where AWS's EFA installer puts libfabric (its fi_info is /opt/amazon/efa/bin/fi_info in AWS's
# docs and in users' scripts)
LIBFABRIC_PREFIX = "/opt/amazon/efa"
# libfabric 2.6.0's providers (configure.ac's FI_PROVIDER_SETUP, hooks apart): each one the
# matrix does not name is configured --disable-<name>, so the build has exactly the ones declared
# and a missing prerequisite of a declared one stops configure (--enable-<name>=yes)
LIBFABRIC_PROVIDERS = (
    "psm2",
    "psm3",
    "sockets",
    "verbs",
    "efa",
    "cxi",
    "usnic",
    "udp",
    "tcp",
    "rxm",
    "mrail",
    "rxd",
    "shm",
    "sm2",
    "ucx",
    "lpp",
    "opx",
    "lnx",
)


# where the libfabric-build stage lays out the wheels' headers and cudart as a toolkit tree
# (include/, lib64/libcudart.so) for configure --with-cuda; the plugin's stage, built FROM it, too
CUDA_HEADER_TREE = "/tmp/cuda"  # noqa: S108 (a path inside a build stage, not this machine's)


def cuda_build_tree(f: Facts) -> str:
    """The CUDA tree the fabric's compiles read (headers; libcudart for a link): the toolkit in a
    CUDA compile stage, else the tree the libfabric-build stage makes of the wheels."""
    return "/usr/local/cuda" if f.build_has_cuda else CUDA_HEADER_TREE


def block(f: Facts) -> Block:
    built = f.spec.fabric.on(f.cell.platform, f.ibr.providers, f.mpir.install).get("libfabric")
    if built is None:
        return Block(None)
    lf = f.spec.fabric.libfabric
    if lf is None:  # on() only returns declared components
        return Block(None)
    source = f.source(built.source)
    major = f.cell.cuda.split(".")[0]
    site = f"{f.python_prefix}/lib/python{f.py}/site-packages"
    headers = None
    if not f.build_has_cuda:
        # the runtime wheel's include/ and the row's header wheels (the crt/ its cuda_runtime.h
        # includes, nvml.h), hash-pinned
        if set(f.cu.build_headers) != {"crt", "nvml"}:
            raise ValueError(
                f"cuda {f.cell.cuda}: build_headers (crt, nvml) is needed to compile libfabric's CUDA support"
            )
        runtime = f.cu.wheels["cuda_runtime"]
        headers = f.lock(
            f"cuda{f.cell.cuda}-headers-{f.python_tag}",
            (
                f"{runtime.package}=={runtime.version}",
                *(f"{w.package}=={w.version}" for w in f.cu.build_headers.values()),
            ),
        )
    return Block(
        {
            "version": built.version,
            "source": source,
            "prefix": LIBFABRIC_PREFIX,
            "providers": lf.providers,
            "disabled": [p for p in LIBFABRIC_PROVIDERS if p not in lf.providers],
            "cuda_tree": "/usr/local/cuda" if f.build_has_cuda else CUDA_HEADER_TREE,
            "headers_lock": headers.path if headers else None,
            # every include/ the header lock installs (nvidia/<wheel>/include, or cu13's one tree)
            "wheel_includes": f"{site}/nvidia/*/include",
            "gdrcopy_prefix": GDRCOPY_PREFIX if f.spec.fabric.gdrcopy else None,
            # libfabric's CUDA support dlopens the runtime by its unversioned name, "libcudart.so"
            # (src/hmem_cuda.c), which NVIDIA's wheels do not ship (only libcudart.so.N): without
            # this link FI_HMEM is off and EFA cannot take GPU buffers. It names the image's one
            # cudart (the CUDA row's wheel), so no second copy enters.
            "cudart": f"{runtime_tree(f)}/lib/libcudart.so.{major}",
        },
        sources=(built.source,),
        locks=(headers,) if headers else (),
        manifest={
            "version": built.version,
            "from": "source",
            "commit": source["commit"],
            "prefix": LIBFABRIC_PREFIX,
            "providers": list(lf.providers),
        },
    )
