"""The OCI platform a cell is built for: its architecture's names in each ecosystem."""

from __future__ import annotations

from .facts import Block, Facts


def block(f: Facts) -> Block:
    return Block(
        {
            "id": f.cell.platform,
            "arch": f.plat.arch,
            "machine": f.plat.machine,
            "nvidia_repo": f.plat.nvidia_repo,
            "image": f.cell.image,
        }
    )
