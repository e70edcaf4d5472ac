"""What differs between MPI implementations (launchers, version strings, rank variables), and
the version codes the CUDA libraries report; chosen from the manifest, never per image."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MpiFlavor:
    """What differs between MPI implementations, chosen by the manifest's ``mpi.kind``."""

    kind: str
    version: str
    prefix: str
    launchers: tuple[str, ...]  # the launcher, version and PATH checks are the image's own doctor's (mpi.launcher)
    library_regex: str  # group 1 = version, applied to MPI_Get_library_version()
    rank_vars: dict[str, str] = field(default_factory=dict)  # rank/size/local_rank/local_size

    @staticmethod
    def from_manifest(manifest: dict[str, Any]) -> MpiFlavor:
        mpi = manifest["components"]["mpi"]
        kind, version, prefix = mpi["kind"], str(mpi["version"]), mpi.get("prefix", "")
        if kind == "openmpi":
            return MpiFlavor(
                kind,
                version,
                prefix,
                ("mpirun", "mpiexec"),
                r"Open MPI v(\d[\w.]*?)(?:[,\s]|$)",
                {
                    "rank": "OMPI_COMM_WORLD_RANK",
                    "size": "OMPI_COMM_WORLD_SIZE",
                    "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
                    "local_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
                },
            )
        if kind == "intelmpi":
            return MpiFlavor(
                kind,
                version,
                prefix,
                ("mpiexec", "mpirun"),
                r"Intel\(R\) MPI Library\s+(\d[\w.]*)",
                {
                    "rank": "PMI_RANK",
                    "size": "PMI_SIZE",
                    "local_rank": "MPI_LOCALRANKID",
                    "local_size": "MPI_LOCALNRANKS",
                },
            )
        raise ValueError(f"the conformance suite does not know MPI kind {kind!r} (manifest components.mpi.kind)")

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def local(self, n: int) -> str:
        """Launch ``n`` ranks in one container. Open MPI refuses more ranks than cores
        without oversubscription (a host fact, not an image one: 2 cores here)."""
        if self.kind == "openmpi":
            if self.major >= 5:
                return f"mpirun -np {n} --map-by :OVERSUBSCRIBE"
            return f"mpirun -np {n} --oversubscribe"
        return f"mpiexec -n {n}"

    def forward(self, names: list[str]) -> str:
        """Launcher options handing these variables of the launching environment to every rank,
        remote ones included (how Azure ML's own mpirun passes AZ_BATCH_* on)."""
        if not names:
            return ""
        if self.kind == "openmpi":
            return " ".join(f"-x {n}" for n in names)
        return f"-genvlist {','.join(names)}"

    def across(self, hosts: list[str], per_host: int) -> str:
        n = len(hosts) * per_host
        if self.kind == "openmpi":
            return f"mpirun -np {n} -H " + ",".join(f"{h}:{per_host}" for h in hosts) + " --map-by slot"
        return f"mpiexec -hosts {','.join(hosts)} -n {n} -ppn {per_host}"


def cudnn_version_code(version: str) -> int:
    """CUDNN_VERSION as ``cudnnGetVersion`` returns it (x10 for the major from cuDNN 9)."""
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    if major >= 9:
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def cuda_version_code(version: str) -> int:
    """CUDART_VERSION as ``cudaRuntimeGetVersion`` returns it: "12.8" -> 12080."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return major * 1000 + minor * 10
