"""NCCL: the one copy every framework loads, from NVIDIA's wheel at the CUDA row's version."""

from __future__ import annotations

from .facts import Block, Facts


def block(f: Facts) -> Block:
    lock = f.lock(f"nccl{f.cu.nccl}-cuda{f.cell.cuda}-{f.python_tag}", (f.nccl_pin,))
    return Block(
        {"version": f.cu.nccl, "package": f.cu.wheels["nccl"].package, "lock": lock.path},
        locks=(lock,),
    )
