#!/usr/bin/env python3
"""trainbase launch contract: map whatever the launcher set to what the frameworks read.

Launchers and what they set (read here):
  Open MPI         OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE   (OMPI_COMM_WORLD_NODE_RANK is
                   the rank WITHIN a node, not the node index: never used as NODE_RANK)
  Intel MPI/MPICH  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS   (Hydra's mpiexec)
  Slurm srun       SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST,
                   SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE; with --mpi=pmi2 also PMI_RANK/
                   PMI_SIZE (no MPI_LOCALRANKID), with --mpi=pmix PMIX_RANK: checked against SLURM_*
  torchrun         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT
  Azure ML  mpi   MPI's (above), AZ_BATCH_MASTER_NODE (host:port), AZ_BATCHAI_MPI_MASTER_NODE, AZ_BATCH_HOST_LIST
       pytorch   RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK, MASTER_*, no LOCAL_WORLD_SIZE: it is WORLD_SIZE /
                 the node count (AZ_BATCH_HOST_LIST/_NODE_LIST, AZUREML_NODE_COUNT, CCP_NODES), else not set
       tensorflow TF_CONFIG: the world is read from it, and it is never rewritten
What it sets (for PyTorch, DeepSpeed, Lightning, TensorFlow):
  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK (the node index) GROUP_RANK NNODES
  MASTER_ADDR MASTER_PORT, PL_TRAINER_NUM_NODES/PL_TRAINER_DEVICES (so Lightning's Trainer
  defaults match the launch), TORCHELASTIC_RUN_ID (kept from torchrun; for other launchers of
  more than one process it makes Lightning read the world above and refuse a mismatched
  `devices`), and TF_CONFIG with --tf (an existing one is kept byte for byte).

Use:  mpirun ... tb-launch python train.py  |  eval "$(tb-launch --export)"  |  trainbase_launch.apply()
      tb-launch torchrun ... (once a node): torchrun's PET_NNODES/NODE_RANK/MASTER_* set too.
When it cannot decide, or two launchers' variables disagree, it stops naming the variables:
never a silent wrong rank. Standard library only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import socket
import sys
from dataclasses import asdict, dataclass

from trainbase_slurm import expand_hostlist, slurm_tasks_per_node

DEFAULT_MASTER_PORT = 29500  # torch.distributed's default
DEFAULT_TF_PORT = 12345
# Commands that start the node's worker processes themselves and set their RANK/LOCAL_*.
TORCHRUN = {"torchrun", "torch.distributed.run", "torch.distributed.launch"}


class LaunchError(Exception):
    """The launcher's variables do not determine the world; the message says what is missing."""


class NotAWorker(LaunchError):
    """TF_CONFIG names a parameter server or evaluator: no rank, and nothing to map."""


@dataclass(frozen=True)
class World:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # 0: the launcher's variables do not say (see resolve)
    node_rank: int
    nnodes: int  # 0 with local_world_size 0
    master_addr: str
    master_port: int
    hosts: tuple[str, ...] = ()
    run_id: str = "trainbase"
    hosts_from: str = ""  # the variable `hosts` came from, for messages and the order check
    given_tf_config: str = ""  # the launcher's own TF_CONFIG, kept byte for byte

    def env(self, tf: bool = False, tf_port: int = DEFAULT_TF_PORT) -> dict[str, str]:
        out = {
            "RANK": self.rank,
            "WORLD_SIZE": self.world_size,
            "LOCAL_RANK": self.local_rank,
            "NODE_RANK": self.node_rank,
            "GROUP_RANK": self.node_rank,
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": self.master_port,
        }
        # A size the launcher did not give is not exported: a guessed LOCAL_WORLD_SIZE (or the
        # Lightning defaults from it) differing between nodes would split the job.
        if self.local_world_size:
            # Lightning reads Trainer defaults from PL_TRAINER_*: devices == ranks per node, so a
            # mismatched `devices` cannot silently hang rank 0.
            out.update(
                {
                    "LOCAL_WORLD_SIZE": self.local_world_size,
                    "NNODES": self.nnodes,
                    "PL_TRAINER_NUM_NODES": self.nnodes,
                    "PL_TRAINER_DEVICES": self.local_world_size,
                }
            )
        out["TRAINBASE_LAUNCHER"] = self.launcher
        if self.launcher != "single" and self.local_world_size:
            # Lightning (like accelerate) takes the world from RANK/GROUP_RANK/LOCAL_WORLD_SIZE only
            # when torch says "launched by torchelastic" (TORCHELASTIC_RUN_ID). Without it, under
            # mpirun it falls back to MPIEnvironment (or, without mpi4py, one job per rank) and
            # ignores a `devices` x `num_nodes` that differs from the launch; with it, that mismatch
            # stops every rank. Not for a lone process: Lightning may spawn its own workers there.
            out["TORCHELASTIC_RUN_ID"] = self.run_id
        if tf:
            out["TF_CONFIG"] = self.given_tf_config or json.dumps(self.tf_config(tf_port), separators=(",", ":"))
        return {k: str(v) for k, v in out.items()}

    def tf_config(self, port: int = DEFAULT_TF_PORT) -> dict:
        """MultiWorkerMirroredStrategy: one worker per rank, `host_of_node:port+local_rank`."""
        if self.given_tf_config:
            return json.loads(self.given_tf_config)
        if not self.local_world_size:
            raise LaunchError(
                "TF_CONFIG needs the ranks per node: set LOCAL_WORLD_SIZE (or give the node count, "
                "e.g. AZ_BATCH_HOST_LIST)"
            )
        if self.nnodes > 1 and len(self.hosts) != self.nnodes:
            found = f"; {self.hosts_from} lists {len(self.hosts)}" if self.hosts else ""
            raise LaunchError(
                f"TF_CONFIG needs every node's address ({self.nnodes} nodes{found}): set TRAINBASE_HOSTS="
                "host0,host1,... in node order (Slurm jobs derive it from SLURM_JOB_NODELIST, Azure ML jobs "
                "from AZ_BATCH_HOST_LIST)"
            )
        # The worker list is written node by node: right only where ranks are placed that way
        # (a cyclic srun would give every worker another one's address).
        if divmod(self.rank, self.local_world_size) != (self.node_rank, self.local_rank):
            raise LaunchError(
                f"TF_CONFIG: rank {self.rank} is local rank {self.local_rank} of node {self.node_rank}, "
                "so ranks are not placed by node in blocks: launch them in blocks (srun -m block)"
            )
        # Batch documents AZ_BATCH_HOST_LIST as the task's nodes, not in the order mpirun placed the
        # ranks: where this node finds itself elsewhere in it, the list cannot be the node order.
        local = _local_addresses(list(self.hosts)) if self.hosts_from.startswith("AZ_BATCH") else set()
        mine = [i for i, h in enumerate(self.hosts) if h in local]
        if mine and self.node_rank not in mine:
            raise LaunchError(
                f"{self.hosts_from} lists this node ({self.hosts[mine[0]]}) as node {mine[0]}, but its "
                f"ranks say NODE_RANK={self.node_rank}: set TRAINBASE_HOSTS in node order"
            )
        hosts = self.hosts or ("localhost",)
        workers = [
            f"{hosts[r // self.local_world_size]}:{port + r % self.local_world_size}" for r in range(self.world_size)
        ]
        return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": self.rank}}


def _int(env: dict, name: str) -> int:
    value = env.get(name)
    if value is None or value == "":
        raise LaunchError(f"{name} is not set")
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer") from None


def _node_index(launcher: str, rank: int, size: int, local_rank: int, local_size: int, rank_var: str) -> int:
    """Node index from a rank when the launcher does not give one. Valid only when ranks are
    placed by node in blocks of equal size; anything else is refused, loudly."""
    if local_size <= 0 or size % local_size:
        raise LaunchError(
            f"{launcher}: {size} ranks do not split into nodes of {local_size}: cannot derive "
            f"NODE_RANK (set NODE_RANK yourself, or launch the same number of ranks per node)"
        )
    if rank % local_size != local_rank:
        raise LaunchError(
            f"{launcher}: {rank_var}={rank} has local rank {local_rank}, so ranks are not placed "
            f"by node in blocks (e.g. mpirun --map-by node): cannot derive NODE_RANK (use "
            f"--map-by slot/ppr:N:node, or set NODE_RANK yourself)"
        )
    return rank // local_size


def _slurm_tasks_per_node(env: dict) -> int:
    try:
        return slurm_tasks_per_node(env)
    except ValueError as e:
        raise LaunchError(f"Slurm: {e}") from None


def _hosts(env: dict, slurm: bool) -> tuple[list[str], str]:
    """Node addresses in node order, and the variable they came from."""
    if slurm and env.get("SLURM_JOB_NODELIST") and not env.get("TRAINBASE_HOSTS"):
        return expand_hostlist(env["SLURM_JOB_NODELIST"]), "SLURM_JOB_NODELIST"
    var, sep = next(
        (
            (v, s)
            for v, s in (("TRAINBASE_HOSTS", ","), ("AZ_BATCH_HOST_LIST", ","), ("AZ_BATCH_NODE_LIST", ";"))
            if env.get(v)
        ),
        ("", ","),
    )
    return [h for h in env.get(var, "").split(sep) if h], var


def _node_count(env: dict) -> tuple[str, int]:
    """(variable, nodes in the job) from AmlCompute's Batch variables (documented for `type: mpi`, not
    for `type: pytorch`) or the AZUREML_NODE_COUNT launch scripts use; ("", 0) when none is set."""
    seen: dict[str, int] = {}
    for var, count in (
        ("AZ_BATCH_HOST_LIST", lambda v: len([h for h in v.split(",") if h])),
        ("AZ_BATCH_NODE_LIST", lambda v: len([h for h in v.split(";") if h])),
        ("AZUREML_NODE_COUNT", int),
        ("CCP_NODES", lambda v: int(v.split()[0])),
    ):  # "N ip n ip n"
        try:
            seen.update({var: count(env[var])} if env.get(var) else {})
        except (ValueError, IndexError):
            raise LaunchError(f"{var}={env[var]!r} does not give a node count") from None
    if len(set(seen.values())) > 1:
        raise LaunchError("the node counts disagree: " + ", ".join(f"{k} gives {v}" for k, v in seen.items()))
    return next(iter(seen.items()), ("", 0))


def _local_addresses(hosts: list[str]) -> set[str]:
    """This machine's name and the address it reaches the other nodes from: a UDP connect sends
    nothing and looks no name up, so this cannot stall on a slow resolver."""
    for host in hosts:
        with contextlib.suppress(OSError, ValueError), socket.socket(
            socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET, socket.SOCK_DGRAM
        ) as s:
            s.connect((host, 9))
            return {socket.gethostname(), s.getsockname()[0]}
    return {socket.gethostname()}


def _tf_world(env: dict) -> tuple[int, int, int, int, int, list[str]] | None:
    """(rank, size, local rank, local size, node, hosts) from an existing TF_CONFIG, which Azure ML's
    `type: tensorflow` writes per worker: the truth about the world, read and never rewritten."""
    if not (text := env.get("TF_CONFIG")):
        return None
    try:
        cfg = json.loads(text)
    except ValueError:
        raise LaunchError(f"TF_CONFIG is not JSON: {text[:80]!r}") from None
    cluster, task = (cfg.get("cluster"), cfg.get("task")) if isinstance(cfg, dict) else (None, None)
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise LaunchError(f"TF_CONFIG has no cluster or no task: {text[:80]}")
    chief, workers = list(cluster.get("chief") or []), list(cluster.get("worker") or [])
    everyone = chief + workers  # TF numbers the chief first (multi_worker_util.id_in_cluster)
    if not everyone or not all(isinstance(w, str) for w in everyone):
        raise LaunchError("TF_CONFIG has no cluster worker list of host:port entries")
    kind, index = task.get("type"), task.get("index", 0)
    if kind in ("ps", "evaluator"):
        raise NotAWorker(f"TF_CONFIG: this task is {kind} {index}, not a worker: it has no rank to map")
    if kind not in ("chief", "worker") or not isinstance(index, int) or not 0 <= index < len(cluster.get(kind) or []):
        raise LaunchError(f"TF_CONFIG: task {kind} index {index!r} is not in its cluster")
    rank = index + (len(chief) if kind == "worker" else 0)
    hosts = [w.rsplit(":", 1)[0].strip("[]") for w in everyone]
    nodes, mine = list(dict.fromkeys(hosts)), hosts[rank]
    return rank, len(everyone), hosts[:rank].count(mine), hosts.count(mine), nodes.index(mine), nodes


def _master(env: dict, nnodes: int, hosts: list[str], size: int, rank0_host: str = "") -> tuple[str, int]:
    port = env.get("MASTER_PORT")
    if port and not port.isdigit():
        raise LaunchError(f"MASTER_PORT={port!r} is not a port number")
    az_host, _, az_port = env.get("AZ_BATCH_MASTER_NODE", "").partition(":")
    # AZ_BATCH_MASTER_NODE's port goes with its address only; TF_CONFIG's worker 0 is rank 0
    if not (addr := env.get("MASTER_ADDR") or rank0_host) and az_host:
        addr, port = az_host, port or (az_port if az_port.isdigit() else "")
    if not (
        addr := addr
        or env.get("AZ_BATCHAI_MPI_MASTER_NODE")
        or (hosts[0] if hosts else "")
        or ("127.0.0.1" if nnodes == 1 else "")
    ):
        what = f"multi-node job ({nnodes} nodes)" if nnodes else f"a world of {size} ranks on nodes not known here"
        raise LaunchError(
            f"{what} but no master address: set MASTER_ADDR (Azure ML sets "
            "AZ_BATCH_MASTER_NODE or AZ_BATCHAI_MPI_MASTER_NODE; Slurm sets SLURM_JOB_NODELIST)"
        )
    return addr, int(port) if port else DEFAULT_MASTER_PORT


def resolve(env: dict | None = None) -> World:
    """The world as the launcher described it. Raises LaunchError when it cannot be decided."""
    env = dict(os.environ if env is None else env)
    tf = _tf_world(env)
    nnodes, rank0_host = None, ""
    if "OMPI_COMM_WORLD_RANK" in env:
        launcher, rank_var, size_var = "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
        rank, size = _int(env, rank_var), _int(env, size_var)
        local_rank, local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
        node = _node_index(launcher, rank, size, local_rank, local_size, rank_var)
    elif "PMI_RANK" in env and ("MPI_LOCALRANKID" in env or "SLURM_PROCID" not in env):
        # Hydra (Intel MPI, MPICH) sets MPI_LOCALRANKID, and inside an sbatch script its ranks also
        # see the batch step's SLURM_PROCID=0: its own variables win. Slurm's PMI-2 plugin sets
        # PMI_RANK without it; there SLURM_* (next branch) describe the world.
        launcher, rank_var, size_var = "pmi", "PMI_RANK", "PMI_SIZE"
        rank, size = _int(env, rank_var), _int(env, size_var)
        if "MPI_LOCALRANKID" not in env or "MPI_LOCALNRANKS" not in env:
            missing = "MPI_LOCALRANKID" if "MPI_LOCALRANKID" not in env else "MPI_LOCALNRANKS"
            raise LaunchError(
                f"pmi: {missing} is not set (Hydra's mpiexec sets it; under srun --mpi=pmi2 "
                "Slurm's SLURM_* variables give the world instead)"
            )
        local_rank, local_size = _int(env, "MPI_LOCALRANKID"), _int(env, "MPI_LOCALNRANKS")
        node = _node_index(launcher, rank, size, local_rank, local_size, rank_var)
    elif "SLURM_PROCID" in env:
        launcher, rank_var, size_var = "slurm", "SLURM_PROCID", "SLURM_NTASKS"
        rank, size = _int(env, rank_var), _int(env, size_var)
        local_rank, node = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
        local_size = _slurm_tasks_per_node(env)
        # srun --mpi=pmi2 / pmix: the MPI library will take its rank from PMI, torch from RANK
        # below; a PMI that belongs to another step or launcher would pair them wrongly.
        for var, svar in (("PMI_RANK", rank_var), ("PMI_SIZE", size_var), ("PMIX_RANK", rank_var)):
            if var in env and _int(env, var) != _int(env, svar):
                raise LaunchError(
                    f"slurm: {var}={env[var]} but {svar}={env[svar]}: the MPI library and "
                    "Slurm disagree about this task"
                )
    elif tf:
        launcher, rank_var, size_var = "tf_config", "RANK", "WORLD_SIZE"
        rank, size, local_rank, local_size, node, hosts = tf
        hosts_from, nnodes, rank0_host = "TF_CONFIG", len(hosts), hosts[0]
        if (count := _node_count(env))[1] not in (0, nnodes):
            raise LaunchError(f"TF_CONFIG lists {nnodes} hosts but {count[0]} has {count[1]} nodes")
        for var, value in (("WORLD_SIZE", size), ("RANK", rank)):
            if var in env and _int(env, var) != value:
                raise LaunchError(f"TF_CONFIG makes this task rank {rank} of {size} but {var}={env[var]}")
    elif "RANK" in env or "WORLD_SIZE" in env:
        launcher = "torchrun" if ("TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env) else "env"
        rank_var, size_var = "RANK", "WORLD_SIZE"
        rank, size, local_rank = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
        node_var = next((v for v in ("GROUP_RANK", "NODE_RANK") if v in env), "")
        node = _int(env, node_var) if node_var else None
        if "LOCAL_WORLD_SIZE" in env:
            local_size = _int(env, "LOCAL_WORLD_SIZE")
        elif count := _node_count(env)[1]:
            # Azure ML's `type: pytorch` sets no LOCAL_WORLD_SIZE: taking the whole world as one
            # node put node 1 outside it (and left node 0 waiting)
            if size % count:
                raise LaunchError(f"env: WORLD_SIZE={size} does not split over {_node_count(env)[0]}'s {count} nodes")
            local_size = size // count
        else:
            # Node 0 cannot tell 2 x 2 from 1 x 4, and every node must export the same set: none
            # is guessed (0), the variables Azure set pass through, torch needs no more
            local_size = 1 if size == 1 else 0
        if node is None and local_size:
            node = _node_index(launcher, rank, size, local_rank, local_size, "RANK")
        elif node is not None and not any(  # ranks in blocks of n a node, as torchrun and Azure ML place them
            n > local_rank and size % n == 0 and rank == node * n + local_rank < size
            for n in ([local_size] if local_size else range(1, size + 1))
        ):
            raise LaunchError(
                f"{launcher}: RANK={rank}, LOCAL_RANK={local_rank} and {node_var}={node} do not fit "
                f"{size} ranks in nodes of {local_size or 'any one size'}: one of them belongs to "
                "another process"
            )
    else:
        launcher, rank_var, size_var = "single", "", ""
        rank, size, local_rank, local_size, node = 0, 1, 0, 1, 0
    if launcher != "tf_config":
        hosts, hosts_from = _hosts(env, slurm=launcher == "slurm")
    if tf and launcher != "tf_config" and (tf[1], tf[0]) != (size, rank):
        raise LaunchError(
            f"TF_CONFIG lists {tf[1]} worker(s) and makes this task rank {tf[0]}, but "
            f"{size_var}={size} and {rank_var}={rank}"
        )
    if not (0 <= rank < size and 0 <= local_rank < (local_size or size)):
        raise LaunchError(
            f"{launcher}: inconsistent values: rank {rank} of {size}, local rank {local_rank} of {local_size}"
        )
    if node is None:
        raise LaunchError(
            "env: RANK/WORLD_SIZE without LOCAL_WORLD_SIZE, NODE_RANK or a node count: set "
            "LOCAL_WORLD_SIZE (WORLD_SIZE on one node) or NODE_RANK"
        )
    if nnodes is None:
        nnodes = (size // local_size if size % local_size == 0 else -1) if local_size else 0
    if local_size and (nnodes < 1 or not 0 <= node < nnodes):
        raise LaunchError(f"{launcher}: node {node} is outside the {size}/{local_size}-node world")
    addr, master_port = _master(env, nnodes, hosts, size, rank0_host)
    return World(
        launcher,
        rank,
        size,
        local_rank,
        local_size,
        node,
        nnodes,
        addr,
        master_port,
        tuple(hosts),
        run_id=env.get("TORCHELASTIC_RUN_ID") or "trainbase",
        hosts_from=hosts_from,
        given_tf_config=env["TF_CONFIG"] if tf else "",
    )


def torchrun_options(world: World | None, env: dict) -> dict[str, str]:
    """torchrun's options as the PET_* variables it reads them from (its command line wins).
    torchrun is started once a node, so the launch's world is the nodes and its rank the node
    index; without these (it reads no NNODES/NODE_RANK) every node ran a world of its own."""
    if world is None or world.world_size == 1:
        return {}
    if world.local_world_size > 1 or world.node_rank != world.rank:
        raise LaunchError(
            f"torchrun starts the node's processes itself: start it once a node (here rank "
            f"{world.rank} on node {world.node_rank}, LOCAL_WORLD_SIZE={world.local_world_size or 'unset'})"
        )
    return {
        k: str(v)
        for k, v in (
            ("PET_NNODES", world.world_size),
            ("PET_NODE_RANK", world.rank),
            ("PET_MASTER_ADDR", world.master_addr),
            ("PET_MASTER_PORT", world.master_port),
        )
        if k not in env
    }


def apply(tf: bool = False, env: dict | None = None) -> World:
    """Set the mapped variables in os.environ (for `import trainbase_launch; apply()`)."""
    world = resolve(env)
    os.environ.update(world.env(tf=tf))
    return world


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="tb-launch",
        description=__doc__.split("\n\n")[0],
        usage="tb-launch [--tf] [--hosts H0,H1] (--export | --json | [--] CMD ...)",
    )
    ap.add_argument("--export", action="store_true", help="print `export NAME=value` lines for eval")
    ap.add_argument("--json", action="store_true", help="print the resolved world as JSON")
    ap.add_argument(
        "--tf", action="store_true", help="also set TF_CONFIG (one worker per rank; an existing one is kept)"
    )
    ap.add_argument("--tf-port", type=int, default=DEFAULT_TF_PORT)
    ap.add_argument("--hosts", help="node addresses in node order (default: $TRAINBASE_HOSTS, Slurm's, Azure's)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    env = dict(os.environ)
    if a.hosts:
        env["TRAINBASE_HOSTS"] = a.hosts
    try:
        world = resolve(env)
        mapped = world.env(tf=a.tf, tf_port=a.tf_port)
    except NotAWorker as e:  # Azure ML runs the job's one command line on parameter servers too
        print(f"tb-launch: {e}; running the command unchanged", file=sys.stderr)
        world, mapped = None, {}
    except LaunchError as e:
        print(f"tb-launch: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"world": world and asdict(world), "env": mapped}, indent=2))
        return 0
    if a.export:
        for k, v in mapped.items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("give a command to run, or --export / --json")
    if os.path.basename(cmd[0]) in TORCHRUN or (len(cmd) > 2 and cmd[1] == "-m" and cmd[2] in TORCHRUN):
        # torchrun starts the node's workers itself: "devices = 1 per node" from a one-per-node
        # launch would make Lightning refuse the world torchrun builds
        mapped.pop("PL_TRAINER_DEVICES", None)
        try:
            mapped.update(torchrun_options(world, os.environ))
        except LaunchError as e:
            print(f"tb-launch: error: {e}", file=sys.stderr)
            return 2
    os.environ.update(mapped)
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        print(f"tb-launch: error: {cmd[0]}: command not found", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
