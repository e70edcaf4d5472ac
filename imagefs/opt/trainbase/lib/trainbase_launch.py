#!/usr/bin/env python3
"""trainbase launch contract: map whatever the launcher set to what the frameworks read.

Launchers and what they set (read here):
  Open MPI         OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE   (OMPI_COMM_WORLD_NODE_RANK is
                   the rank WITHIN a node, not the node index: never used as NODE_RANK)
  Intel MPI/MPICH  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
  Slurm            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST,
                   SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE
  torchrun         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT
  Azure ML         AZ_BATCH_MASTER_NODE (host:port), AZ_BATCHAI_MPI_MASTER_NODE (host)
What it sets (for PyTorch, DeepSpeed, Lightning, TensorFlow):
  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK (the node index) GROUP_RANK NNODES
  MASTER_ADDR MASTER_PORT, PL_TRAINER_NUM_NODES/PL_TRAINER_DEVICES (so Lightning's Trainer
  defaults match the launch), TORCHELASTIC_RUN_ID (kept from torchrun; for other launchers of
  more than one process it makes Lightning read the world above and refuse a mismatched
  `devices`), and TF_CONFIG with --tf.

Use:  mpirun ... tb-launch python train.py        (wrapper: exec with the mapped env)
      eval "$(tb-launch --export)"                (shell)
      import trainbase_launch; trainbase_launch.apply()   (Python)
When it cannot decide (e.g. a multi-node job with no master address) it stops with a message
naming the missing variable: never a silent wrong rank. Standard library only.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass

DEFAULT_MASTER_PORT = 29500    # torch.distributed's default
DEFAULT_TF_PORT = 12345


class LaunchError(Exception):
    """The launcher's variables do not determine the world; the message says what is missing."""


@dataclass(frozen=True)
class World:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    hosts: tuple[str, ...] = ()
    run_id: str = "trainbase"

    def env(self, tf: bool = False, tf_port: int = DEFAULT_TF_PORT) -> dict[str, str]:
        out = {
            "RANK": self.rank, "WORLD_SIZE": self.world_size, "LOCAL_RANK": self.local_rank,
            "LOCAL_WORLD_SIZE": self.local_world_size, "NODE_RANK": self.node_rank, "GROUP_RANK": self.node_rank,
            "NNODES": self.nnodes, "MASTER_ADDR": self.master_addr, "MASTER_PORT": self.master_port,
            # Lightning reads Trainer defaults from PL_TRAINER_*: devices == ranks per node, so a
            # mismatched `devices` cannot silently hang rank 0.
            "PL_TRAINER_NUM_NODES": self.nnodes, "PL_TRAINER_DEVICES": self.local_world_size,
            "TRAINBASE_LAUNCHER": self.launcher,
        }
        if self.launcher != "single":
            # Lightning (like accelerate) takes the world from RANK/GROUP_RANK/LOCAL_WORLD_SIZE
            # only when torch says "launched by torchelastic", i.e. TORCHELASTIC_RUN_ID is set.
            # Without it, under mpirun it falls back to MPIEnvironment (or, without mpi4py, runs
            # one independent job per rank) and silently ignores a `devices` x `num_nodes` that
            # differs from the launch; with it, that mismatch stops every rank with Lightning's
            # "does not match the world size". Not for a lone process: Lightning may spawn its
            # own workers there.
            out["TORCHELASTIC_RUN_ID"] = self.run_id
        if tf:
            out["TF_CONFIG"] = json.dumps(self.tf_config(tf_port), separators=(",", ":"))
        return {k: str(v) for k, v in out.items()}

    def tf_config(self, port: int = DEFAULT_TF_PORT) -> dict:
        """MultiWorkerMirroredStrategy: one worker per rank, `host_of_node:port+local_rank`."""
        if self.nnodes > 1 and len(self.hosts) != self.nnodes:
            raise LaunchError(
                f"TF_CONFIG needs every node's address ({self.nnodes} nodes): set TRAINBASE_HOSTS="
                "host0,host1,... in node order (Slurm jobs derive it from SLURM_JOB_NODELIST)")
        hosts = self.hosts or ("localhost",)
        workers = [f"{hosts[r // self.local_world_size]}:{port + r % self.local_world_size}"
                   for r in range(self.world_size)]
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
        raise LaunchError(f"{launcher}: {size} ranks do not split into nodes of {local_size}: cannot derive "
                          f"NODE_RANK (set NODE_RANK yourself, or launch the same number of ranks per node)")
    if rank % local_size != local_rank:
        raise LaunchError(f"{launcher}: {rank_var}={rank} has local rank {local_rank}, so ranks are not placed "
                          f"by node in blocks (e.g. mpirun --map-by node): cannot derive NODE_RANK (use "
                          f"--map-by slot/ppr:N:node, or set NODE_RANK yourself)")
    return rank // local_size


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist: 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return hosts


def _slurm_tasks_per_node(env: dict) -> int:
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    if not spec:
        raise LaunchError("Slurm: SLURM_TASKS_PER_NODE is not set")
    counts = {int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", spec)}
    if len(counts) != 1:
        raise LaunchError(f"Slurm: uneven tasks per node ({spec}): LOCAL_WORLD_SIZE differs between nodes")
    return counts.pop()


def _master(env: dict, nnodes: int, hosts: list[str]) -> tuple[str, int | None]:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"], None
    az = env.get("AZ_BATCH_MASTER_NODE")
    if az:
        host, _, port = az.partition(":")
        return host, int(port) if port.isdigit() else None
    if env.get("AZ_BATCHAI_MPI_MASTER_NODE"):
        return env["AZ_BATCHAI_MPI_MASTER_NODE"], None
    if hosts:
        return hosts[0], None
    if nnodes == 1:
        return "127.0.0.1", None
    raise LaunchError(
        f"multi-node job ({nnodes} nodes) but no master address: set MASTER_ADDR (Azure ML sets "
        "AZ_BATCH_MASTER_NODE or AZ_BATCHAI_MPI_MASTER_NODE; Slurm sets SLURM_JOB_NODELIST)")


def resolve(env: dict | None = None) -> World:
    """The world as the launcher described it. Raises LaunchError when it cannot be decided."""
    env = dict(os.environ if env is None else env)
    hosts = [h for h in env.get("TRAINBASE_HOSTS", "").split(",") if h]
    if "OMPI_COMM_WORLD_RANK" in env:
        launcher = "openmpi"
        rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        local_rank, local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
        node = _node_index(launcher, rank, size, local_rank, local_size, "OMPI_COMM_WORLD_RANK")
    elif "PMI_RANK" in env:
        launcher = "pmi"  # Intel MPI, MPICH (Hydra)
        rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
        if "MPI_LOCALRANKID" not in env or "MPI_LOCALNRANKS" not in env:
            missing = "MPI_LOCALRANKID" if "MPI_LOCALRANKID" not in env else "MPI_LOCALNRANKS"
            raise LaunchError(f"pmi: {missing} is not set (Hydra's mpiexec sets it; another PMI launcher may not)")
        local_rank, local_size = _int(env, "MPI_LOCALRANKID"), _int(env, "MPI_LOCALNRANKS")
        node = _node_index(launcher, rank, size, local_rank, local_size, "PMI_RANK")
    elif "SLURM_PROCID" in env:
        launcher = "slurm"
        rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local_rank, node = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
        local_size = _slurm_tasks_per_node(env)
        if not hosts and env.get("SLURM_JOB_NODELIST"):
            hosts = expand_hostlist(env["SLURM_JOB_NODELIST"])
    elif "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun" if ("TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env) else "env"
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK")
        local_size = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else size
        if "GROUP_RANK" in env or "NODE_RANK" in env:
            node = _int(env, "GROUP_RANK" if "GROUP_RANK" in env else "NODE_RANK")
        else:
            node = _node_index(launcher, rank, size, local_rank, local_size, "RANK")
    else:
        launcher = "single"
        rank, size, local_rank, local_size, node = 0, 1, 0, 1, 0
    if not (0 <= rank < size and 0 <= local_rank < local_size):
        raise LaunchError(f"{launcher}: inconsistent values: rank {rank} of {size}, local rank {local_rank} of {local_size}")
    nnodes = size // local_size if size % local_size == 0 else -1
    if nnodes < 1 or not 0 <= node < nnodes:
        raise LaunchError(f"{launcher}: node {node} is outside the {size}/{local_size}-node world")
    addr, az_port = _master(env, nnodes, hosts)
    port = env.get("MASTER_PORT")
    master_port = int(port) if port and port.isdigit() else (az_port or DEFAULT_MASTER_PORT)
    return World(launcher, rank, size, local_rank, local_size, node, nnodes, addr, master_port, tuple(hosts),
                 run_id=env.get("TORCHELASTIC_RUN_ID") or "trainbase")


def apply(tf: bool = False, env: dict | None = None) -> World:
    """Set the mapped variables in os.environ (for `import trainbase_launch; apply()`)."""
    world = resolve(env)
    os.environ.update(world.env(tf=tf))
    return world


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="tb-launch", description=__doc__.split("\n\n")[0],
                                 usage="tb-launch [--tf] [--hosts H0,H1] (--export | --json | [--] CMD ...)")
    ap.add_argument("--export", action="store_true", help="print `export NAME=value` lines for eval")
    ap.add_argument("--json", action="store_true", help="print the resolved world as JSON")
    ap.add_argument("--tf", action="store_true", help="also set TF_CONFIG (one worker per rank)")
    ap.add_argument("--tf-port", type=int, default=DEFAULT_TF_PORT)
    ap.add_argument("--hosts", help="node addresses in node order (default: $TRAINBASE_HOSTS / Slurm's nodelist)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    env = dict(os.environ)
    if a.hosts:
        env["TRAINBASE_HOSTS"] = a.hosts
    try:
        world = resolve(env)
        mapped = world.env(tf=a.tf, tf_port=a.tf_port)
    except LaunchError as e:
        print(f"tb-launch: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"world": asdict(world), "env": mapped}, indent=2))
        return 0
    if a.export:
        for k, v in mapped.items():
            print(f"export {k}={shlex.quote(v)}")
        return 0
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("give a command to run, or --export / --json")
    os.environ.update(mapped)
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        print(f"tb-launch: error: {cmd[0]}: command not found", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
