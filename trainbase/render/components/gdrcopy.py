"""GDRCopy's userspace library (libgdrapi), from its pinned source, in every image that declares it
(matrix.yaml's fabric.gdrcopy): UCX's gdr_copy transport and NCCL map GPU memory through it. The
gdrdrv kernel module it talks to is the node's, never the image's."""

from __future__ import annotations

from .facts import Block, Facts

GDRCOPY_PREFIX = "/opt/gdrcopy"


def block(f: Facts) -> Block:
    built = f.spec.fabric.gdrcopy
    if built is None:
        return Block(None)
    source = f.source(built.source)
    # the library's soname carries GDR_API_MAJOR_VERSION (include/gdrapi.h)
    soname = f"libgdrapi.so.{built.version.split('.')[0]}"
    return Block(
        {"version": built.version, "source": source, "prefix": GDRCOPY_PREFIX, "soname": soname},
        sources=(built.source,),
        manifest={
            "version": built.version,
            "from": "source",
            "commit": source["commit"],
            "prefix": GDRCOPY_PREFIX,
            "soname": soname,
        },
    )
