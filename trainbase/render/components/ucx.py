"""UCX: the distro's, DOCA's, or built from the pinned source (with CUDA where the compile stage
has the toolkit)."""

from __future__ import annotations

from .facts import Block, Facts

UCX_PREFIX = "/opt/ucx"
# UCX's CUDA transports (libuct_cuda: cuda_copy, cuda_ipc) where a UCX is built with --with-cuda
# or DOCA's ucx-cuda is installed; gdr_copy (libuct_cuda_gdrcopy) where a UCX built here is also
# built --with-gdrcopy against the image's libgdrapi (fabric.gdrcopy).
UCX_CUDA_TRANSPORTS = ["cuda_copy", "cuda_ipc"]
UCX_GDRCOPY_TRANSPORT = "gdr_copy"


def cuda_transports(f: Facts) -> list[str]:
    """The CUDA transports of the image's UCX: built from source in a stage that has the CUDA
    toolkit (a CUDA devel base, or the row's build_base), or DOCA's ucx-cuda. Debian's libucx0
    has none (built without CUDA)."""
    if f.ucx.source == "source" and f.build_has_cuda:
        return UCX_CUDA_TRANSPORTS + ([UCX_GDRCOPY_TRANSPORT] if f.spec.fabric.gdrcopy else [])
    if f.ucx.source == "doca":
        return list(UCX_CUDA_TRANSPORTS)
    return []


def block(f: Facts) -> Block:
    from_source = f.ucx.source == "source"
    return Block(
        {
            "from": f.ucx.source,
            "version": f.ucx.version,
            "artifact": f.artifact(f.ucx.artifact),
            "prefix": UCX_PREFIX if from_source else "/usr",
            "cuda_transports": cuda_transports(f),
        },
        artifacts=(f.ucx.artifact,) if from_source and f.ucx.artifact else (),
    )
