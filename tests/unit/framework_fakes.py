"""A cluster of two fake containers (hostnames a and b) and a framework image, for the unit tests
that show the framework checks failing without Docker. The checks run unchanged -- the suite's
own Cluster, MpiFlavor and (for Azure ML) Job start every process -- and each fake container
answers a command the way a given image printed it: ``answer(node, cmd, env)`` returns
``(exit code, stdout)`` or ``(exit code, stdout, stderr)``. The lines are the examples' own
formats (examples/*.py), built by the helpers below."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from trainbase_conformance.fixtures import Cluster, Target
from trainbase_conformance.flavors import MpiFlavor

HOSTS = ["a", "b"]
IPS = ["172.30.0.2", "172.30.0.3"]
PREFIX = "/opt/trainbase/venv"
PYTHON = f"{PREFIX}/bin/python"
PARAMS = "5d41402abc4b"  # one set of parameters on every rank (a digest's first 12 characters)

Answer = Callable[[int, str, dict], tuple]


def result(rc: int = 0, stdout: str = "", stderr: str = "") -> SimpleNamespace:
    return SimpleNamespace(returncode=rc, stdout=stdout, stderr=stderr)


class FakeNode:
    """One container: ``hostname -i``, mkdir and copies succeed; every other command is answered."""

    def __init__(self, index: int, answer: Answer):
        self.index, self.hostname, self.answer = index, HOSTS[index], answer
        self.commands: list[tuple[str, dict]] = []

    def exec(self, cmd: str, timeout: int | None = None, env: dict | None = None, login: bool = False):
        if cmd == "hostname -i":
            return result(0, f"{IPS[self.index]}\n")
        if cmd.startswith("mkdir -p "):
            return result()
        self.commands.append((cmd, dict(env or {})))
        return result(*self.answer(self.index, cmd, dict(env or {})))

    def put(self, src: str, dst: str) -> None:
        pass


def mpi_flavor(kind: str) -> MpiFlavor:
    version = "4.1.4" if kind == "openmpi" else "2021.18.1"
    return MpiFlavor.from_manifest({"components": {"mpi": {"kind": kind, "version": version}}})


def cluster(answer: Answer, kind: str = "openmpi") -> Cluster:
    return Cluster(
        nodes=[FakeNode(0, answer), FakeNode(1, answer)], network="tbconf-fake", mpi=mpi_flavor(kind), python=PYTHON
    )


class FakeTarget:
    """A framework image: its manifest, and ``sh`` answered by ``answer(0, cmd, {})``."""

    def __init__(
        self,
        frameworks: dict[str, str],
        answer: Answer | None = None,
        packages: dict | None = None,
        prebuilt_ops: dict | None = None,
        mpi: str = "openmpi",
    ):
        self.name = "trainbase/fake:r1"
        self.ref = self.name
        self.python = PYTHON
        self.manifest = {
            "frameworks": frameworks,
            "framework_packages": packages or {},
            "prebuilt_ops": prebuilt_ops or {},
        }
        self.components = {
            "python": {"prefix": PREFIX},
            "cuda": {"version": "12.8.1"},
            "cudnn": {"version": "9.10.2.21"},
            "nccl": {"version": "2.27.5"},
        }
        self.answer = answer or (lambda node, cmd, env: (0, ""))
        self.mpi_kind = mpi
        self.container = FakeNode(0, self.answer)

    def need_mpi(self) -> MpiFlavor:
        return mpi_flavor(self.mpi_kind)

    def sh(self, cmd: str, timeout: int | None = None):
        r = self.container.exec(cmd, timeout=timeout)
        return SimpleNamespace(rc=r.returncode, stdout=r.stdout, stderr=r.stderr)

    json_probe = Target.json_probe  # the suite's own: its last stdout line, after `sh`


# ----------------------------------------------------------------------------- the examples' lines


def ddp(
    rank: int,
    world: int = 4,
    per_node: int = 2,
    node_rank: int | None = None,
    allreduce: int | None = None,
    params: str = PARAMS,
    host: str | None = None,
) -> str:
    """examples/pytorch_ddp.py's line; ``node_rank`` and ``host`` default to where the rank runs."""
    node = rank // per_node
    node_rank = node if node_rank is None else node_rank
    allreduce = world * (world + 1) // 2 if allreduce is None else allreduce
    return (
        f"OK rank={rank} world={world} local_rank={rank % per_node} node_rank={node_rank} "
        f"host={host or HOSTS[node % 2]} backend=gloo allreduce={allreduce} params={params}\n"
    )


def lightning(rank: int, world: int, env: str, per_node: int = 2, params: str = PARAMS) -> str:
    """examples/lightning_ddp.py's and lightning_azureml.py's line."""
    return (
        f"OK rank={rank} world={world} node_rank={rank // per_node} local_rank={rank % per_node} "
        f"env={env} params={params}\n"
    )


def tf_worker(worker: int, workers: int) -> str:
    """examples/tf_multiworker.py's line: each worker adds worker + 1."""
    return f"OK worker={worker} workers={workers} allreduce={workers * (workers + 1) // 2:g} replicas={workers}\n"


def horovod(rank: int, size: int, local_rank: int = 0) -> str:
    return f"OK rank={rank} size={size} local_rank={local_rank} allreduce={size * (size + 1) // 2:g}\n"


def deepspeed(rank: int, world: int, local_rank: int = 0) -> str:
    return f"OK rank={rank} world={world} local_rank={local_rank} allreduce={world * (world + 1) // 2:g}\n"
