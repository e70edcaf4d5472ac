"""The components of an image, one module each (``block(f: Facts) -> Block``), in the order
their template blocks install them. Adding a component is a module here, its entry in
COMPONENTS, its template block (templates/blocks/) and its checks (trainbase_conformance/checks/)."""

from __future__ import annotations

from collections.abc import Callable

from . import (
    base_os,
    cuda,
    framework,
    gdrcopy,
    ib,
    libfabric,
    mpi,
    nccl,
    nccl_net_plugin,
    nccl_tests,
    platform,
    python,
    ucx,
)
from .facts import Block, Facts

# data key -> the component's function; the base image's layers in install order, then the
# framework's (the templates read each one's data under its key)
COMPONENTS: tuple[tuple[str, Callable[[Facts], Block]], ...] = (
    ("platform", platform.block),
    ("os", base_os.block),
    ("cuda", cuda.block),
    ("nccl", nccl.block),
    ("ib", ib.block),
    ("gdrcopy", gdrcopy.block),
    ("libfabric", libfabric.block),
    ("nccl_net_plugin", nccl_net_plugin.block),
    ("ucx", ucx.block),
    ("mpi", mpi.block),
    ("python", python.block),
    ("nccl_tests", nccl_tests.block),
    ("framework", framework.block),
)

__all__ = ["COMPONENTS", "Block", "Facts"]
