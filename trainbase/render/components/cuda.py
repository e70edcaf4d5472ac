"""CUDA: the base image's toolkit, or NVIDIA's runtime wheels (one lock set) on rows without one."""

from __future__ import annotations

from .facts import Block, Facts


def runtime_tree(f: Facts) -> str:
    """Where NVIDIA's CUDA runtime wheel puts include/cuda.h: nvidia/cuda_runtime (cu12 wheels),
    nvidia/cu13 (the cu13 wheels' one CUDA tree)."""
    major = f.cell.cuda.split(".")[0]
    leaf = "cuda_runtime" if major == "12" else f"cu{major}"
    return f"{f.python_prefix}/lib/python{f.py}/site-packages/nvidia/{leaf}"


def block(f: Facts) -> Block:
    cu, from_wheels = f.cu, f.osr.cuda_from == "wheels"
    lock = f.lock(f"cuda{f.cell.cuda}-{f.python_tag}", f.cuda_pins) if from_wheels else None
    return Block(
        {
            "key": f.cell.cuda,
            "toolkit": cu.toolkit,
            "from": f.osr.cuda_from,
            "cudnn": cu.wheels["cudnn"].version if from_wheels else cu.base_cudnn,
            "cudnn_major": cu.cudnn_major,
            "major": f.cell.cuda.split(".")[0],
            "lock": lock.path if lock else None,
            # the wheel with include/cuda.h, and the tree it installs into (CUDA-aware Open MPI)
            "runtime_package": cu.wheels["cuda_runtime"].package if from_wheels else None,
            "site_packages": f"{f.python_prefix}/lib/python{f.py}/site-packages",
        },
        locks=(lock,) if lock else (),
    )
