"""What every component reads from a cell (Facts), and what each gives back (Block).

A component is one function, ``block(f: Facts) -> Block``, in a module of its own: the cell's
rows and the values derived from them once come in, the data of its template block
(templates/blocks/<name>.j2), the pip lock sets it installs and the artifacts it downloads
go out. hpccm's building blocks have this shape: the block knows its component, the recipe
only lists blocks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ...define.matrix import Cell, Matrix
from ...define.pip_locks import LockSet
from ...define.schema import CudaRow, IbRow, MatrixFile, MpiRow, OsRow, Platform, UcxChoice, staged_source

VENV_PREFIX = "/opt/trainbase/venv"
CONDA_PREFIX = "/opt/conda"


@dataclass(frozen=True)
class Facts:
    """One cell, with its rows looked up and the facts several components need computed once."""

    m: Matrix
    cell: Cell
    spec: MatrixFile
    osr: OsRow
    cu: CudaRow
    ibr: IbRow
    mpir: MpiRow
    ucx: UcxChoice  # the IB row's UCX for this OS family
    plat: Platform
    py: str  # the image's Python (major.minor)
    python_prefix: str  # the venv or conda prefix every pip set installs into
    # the compile stages have the CUDA toolkit: the base is a CUDA devel image, or the row names one
    build_has_cuda: bool
    # pip sets of every platform but the first resolve for that platform's wheels, into files of
    # their own (the same pins, other files and hashes)
    other_platform: bool

    @classmethod
    def of(cls, m: Matrix, cell: Cell) -> Facts:
        s = m.spec
        osr = s.os[cell.os]
        ibr = s.ib[cell.ib]
        return cls(
            m=m,
            cell=cell,
            spec=s,
            osr=osr,
            cu=s.cuda[cell.cuda],
            ibr=ibr,
            mpir=s.mpi[cell.mpi],
            ucx=ibr.ucx_for(cell.os, osr.family),
            plat=s.platforms[cell.platform],
            py=osr.python.version,
            python_prefix=VENV_PREFIX if osr.python.manager == "venv" else CONDA_PREFIX,
            build_has_cuda=osr.cuda_from == "base" or osr.build_base is not None,
            other_platform=cell.platform != s.axes.platform[0],
        )

    @property
    def python_tag(self) -> str:
        return "py" + self.py

    @property
    def os_version(self) -> str:
        return self.cell.os.removeprefix("ubuntu").removeprefix("debian")

    @property
    def cuda_pins(self) -> list[str]:
        """The CUDA row's runtime wheels, NCCL apart (it has a lock set of its own)."""
        return [f"{w.package}=={w.version}" for k, w in self.cu.wheels.items() if k != "nccl"]

    @property
    def nccl_pin(self) -> str:
        return f"{self.cu.wheels['nccl'].package}=={self.cu.nccl}"

    @property
    def image_pins(self) -> list[str]:
        """What is already pinned in the image when a framework set is resolved: the framework's
        resolver must keep these, so its lock cannot bring a second CUDA/NCCL."""
        return (self.cuda_pins if self.osr.cuda_from == "wheels" else []) + [self.nccl_pin]

    def lock(self, name: str, requirements: Iterable[str], context: Iterable[str] = ()) -> LockSet:
        wheel_platform = self.plat.wheel_platform if self.other_platform else None
        return LockSet(name + self.plat.name_tag, self.py, tuple(requirements), tuple(context), wheel_platform)

    def source(self, key: str) -> dict[str, str]:
        """A pinned source tree as the templates mount it: the verified archive the build staged
        (trainbase/build/sources.py) and the pin it was verified against."""
        src = self.spec.sources[key]
        return {
            "key": key,
            "repository": src.repository,
            "tag": src.tag,
            "commit": src.commit,
            "tree": src.tree,
            "archive": staged_source(key),
        }

    def artifact(self, key: str | None) -> dict[str, str | None] | None:
        """The artifact's file for this cell's platform (an architecture's own installer where it
        has one), as the templates download and verify it."""
        if key is None:
            return None
        a = self.spec.artifacts[key]
        f = a.file_for(self.cell.platform)
        return {
            "key": key,
            "url": f.url,
            "sha256": f.sha256,
            "openpgp_fingerprint": a.openpgp_fingerprint,
            "file": f.url.rsplit("/", 1)[-1],
        }


@dataclass(frozen=True)
class Block:
    """A component's part of a cell: its template data, and what it installs (pip lock sets, in
    install order; artifact keys; source keys, matrix.yaml's ``sources``, which the build stages
    verified beforehand) in the image of the layer it belongs to."""

    data: dict[str, Any] | None
    layer: Literal["base", "framework"] = "base"  # which Dockerfile installs it
    locks: tuple[LockSet, ...] = ()
    artifacts: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    # what the image claims of this component (the manifest's components.<key>), where the
    # component says it itself; None: the manifest's own code writes it (context._manifest)
    manifest: dict[str, Any] | None = None
