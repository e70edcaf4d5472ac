"""The OS row: the base image (and the compile stages' base where the row names one), resolved
for the cell's CUDA toolkit and platform (locks/bases.json's keys)."""

from __future__ import annotations

from ...define import base_lock
from .facts import Block, Facts


def block(f: Facts) -> Block:
    osr, toolkit = f.osr, f.cu.toolkit
    platform = f.cell.platform if f.other_platform else None
    base = osr.base.format(cuda_toolkit=toolkit)
    build_base = osr.build_base.format(cuda_toolkit=toolkit) if osr.build_base else None
    return Block(
        {
            "key": f.cell.os,
            "family": osr.family,
            "codename": osr.codename,
            "version": f.os_version,
            "base": base,
            "build_base": build_base,
            "build_base_key": base_lock.key(build_base, platform) if build_base else None,
            "cuda_from": osr.cuda_from,
            "bootstrappable": osr.bootstrap is not None,
            # the base as resolved for this platform (locks/bases.json key; what the build resolves)
            "base_key": base_lock.key(base, platform),
        }
    )
