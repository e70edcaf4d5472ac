"""The NCCL network plugin (matrix.yaml's fabric.nccl_net_plugin): aws-ofi-nccl over the image's
libfabric, built against the image's CUDA (cudart linked dynamically: the image's one cudart, no
static copy inside the plugin) and NCCL's plugin interface, on the platforms it lists.

How NCCL picks it (NCCL's src/plugin/net.cc and plugin_open.cc, 2.27-2.32): with NCCL_NET_PLUGIN
unset it dlopens "libnccl-net.so" from the loader's path (NCCL_NET_PLUGIN=<name> makes it
libnccl-net-<name>.so, =none skips plugins), then keeps the first network whose init succeeds
with a device: the plugin, its own IB, then sockets."""

from __future__ import annotations

from .facts import Block, Facts
from .libfabric import LIBFABRIC_PREFIX, cuda_build_tree

# where AWS's EFA installer puts the plugin (1.30 and later; /opt/aws-ofi-nccl before)
PLUGIN_PREFIX = "/opt/amazon/ofi-nccl"
# what aws-ofi-nccl's src/Makefile.am installs for CUDA: the net plugin under NCCL's default name
# and under its own (NCCL_NET_PLUGIN=ofi); with the AWS platform, the tuner under both of its names
NET_FILES = ["libnccl-net.so", "libnccl-net-ofi.so"]
AWS_TUNER_FILES = ["libnccl-ofi-tuner.so", "libnccl-tuner-ofi.so"]


def block(f: Facts) -> Block:
    built = f.spec.fabric.on(f.cell.platform, f.ibr.providers, f.mpir.install).get("nccl_net_plugin")
    if built is None:
        return Block(None)
    plugin = f.spec.fabric.nccl_net_plugin
    if plugin is None:  # on() only returns declared components
        return Block(None)
    source = f.source(built.source)
    files = NET_FILES + (AWS_TUNER_FILES if plugin.platform_support == "aws" else [])
    paths = [f"{PLUGIN_PREFIX}/lib/{name}" for name in files]
    return Block(
        {
            "name": plugin.name,
            "version": built.version,
            "source": source,
            "prefix": PLUGIN_PREFIX,
            "libfabric_prefix": LIBFABRIC_PREFIX,
            "cuda_tree": cuda_build_tree(f),
            "platform_support": plugin.platform_support,
            "files": paths,
        },
        sources=(built.source,),
        manifest={
            "name": plugin.name,
            "version": built.version,
            "from": "source",
            "commit": source["commit"],
            "fabric": plugin.fabric,
            "platform_support": plugin.platform_support,
            "prefix": PLUGIN_PREFIX,
            "files": paths,
        },
    )
