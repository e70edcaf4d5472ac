"""A framework release (PyTorch, TensorFlow, Horovod, DeepSpeed, TransformerEngine ...) over its
parent image: its pip sets (resolved with everything below it pinned), its sdist and patch where
it builds from source, and nvcc where it compiles CUDA."""

from __future__ import annotations

from typing import Any

from ...define.matrix import Cell
from ...define.pip_locks import LockSet
from .facts import Block, Facts


def chain(f: Facts) -> list[Cell]:
    """The framework cells from the first framework down to this one (parents first)."""
    out = []
    c: Cell | None = f.cell
    while c is not None and c.framework != "none":
        out.append(c)
        c = f.m.cell(c.parent) if c.parent else None
    return list(reversed(out))


def compiler(f: Facts, mode: str) -> dict[str, Any] | None:
    """nvcc for a release that compiles CUDA: the CUDA devel base's, or NVIDIA's wheels (one CUDA
    tree under site-packages/nvidia/cu<major>), with the row's target architectures."""
    if mode == "none":
        return None
    cu = f.cu
    archs = list(cu.architectures)
    from_wheels = f.osr.cuda_from == "wheels"
    major = f.cell.cuda.split(".")[0]
    return {
        "mode": mode,
        "from": "wheels" if from_wheels else "base",
        "home": f"{f.python_prefix}/lib/python{f.py}/site-packages/nvidia/cu{major}"
        if from_wheels
        else "/usr/local/cuda",
        "nvcc": cu.compiler["nvcc"].version if from_wheels else cu.toolkit,
        "pins": [f"{w.package}=={w.version}" for w in cu.compiler.values()] if from_wheels else [],
        "packages": [w.package for w in cu.compiler.values()] if from_wheels else [],
        "lock": None,
        "architectures": archs,
        # torch.utils.cpp_extension / DeepSpeed: "8.0 9.0+PTX"; Horovod: "80,90" (PTX for the last)
        "torch_arch_list": " ".join(archs[:-1] + [archs[-1] + "+PTX"]),
        "cc_list": ",".join(a.replace(".", "") for a in archs),
    }


def block(f: Facts) -> Block:
    cell = f.cell
    if cell.framework == "none":
        return Block(None, layer="framework")
    rel = cell.release
    assert rel is not None  # noqa: S101 -- a framework cell has its release (matrix resolution)
    frameworks = chain(f)
    parents_pkgs = [p for c in frameworks[:-1] for p in c.release.packages]  # type: ignore[union-attr]  # chain: every cell has a release
    set_name = "-".join(f"{c.framework}{c.framework_version}" for c in frameworks) + f"-cuda{cell.cuda}-{f.python_tag}"
    # the CUDA libraries the release loads beyond the image's, at this CUDA row's versions --
    # where CUDA comes from wheels: a CUDA devel base image has the whole toolkit already
    libs = f.cu.libraries
    cuda_libs = (
        [f"{libs[k].package}=={libs[k].version}" for k in rel.cuda_libraries] if f.osr.cuda_from == "wheels" else []
    )
    locks: list[LockSet] = []
    main_lock = f.lock(set_name, [*rel.packages, *cuda_libs], parents_pkgs + f.image_pins)
    build_lock = None
    if rel.build_packages:
        # with the release's own pins (both sets end up in one environment, so an unpinned build
        # dependency must not pick another version of them), but not the framework itself: a
        # lock holds its context, and the framework is built only after the build set is in
        own = [p for p in rel.packages if p.split("==")[0].lower() != cell.framework]
        build_lock = f.lock(set_name + "-build", rel.build_packages, parents_pkgs + f.image_pins + own)
        locks.append(build_lock)
    nvcc = compiler(f, rel.cuda_compiler)
    if nvcc and nvcc["from"] == "wheels":
        # resolved with the image's CUDA pins only: it holds NVIDIA's compiler wheels and
        # nothing of the framework's (whose sdist must not be built before its flags are set)
        compiler_lock = f.lock(f"cuda{cell.cuda}-compiler-{f.python_tag}", nvcc["pins"], f.image_pins)
        nvcc["lock"] = compiler_lock.path
        locks.append(compiler_lock)
    locks.append(main_lock)
    return Block(
        {
            "name": cell.framework,
            "version": rel.version,
            "lock": main_lock.path,
            "build_lock": build_lock.path if build_lock else None,
            "sdist": f.artifact(rel.artifact),
            "patch": {"file": rel.patch.file, "sha256": rel.patch.sha256} if rel.patch else None,
            "requires": dict(rel.requires),
            "compiler": nvcc,
            "prebuilt_ops": list(rel.prebuilt_ops),
        },
        layer="framework",
        locks=tuple(locks),
        artifacts=(rel.artifact,) if rel.artifact else (),
    )
