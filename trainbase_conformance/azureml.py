"""Azure ML's distribution modes as the exact environment each process gets, for a job of N
nodes x P processes on the suite's containers (node i = container i, addressed by its real IP on
the private network, as AmlCompute nodes are). Taken from the Azure ML guides
(how-to-train-distributed-gpu, v1 and v2; Batch's compute-node variables), the same tables the
unit tests feed tb-launch (tests/unit/test_launch_contract.py):

* ``type: mpi`` -- Azure runs the image's ``mpirun`` itself on node 0; the MPI launcher's own
  variables plus the Batch ones below reach every rank;
* ``type: pytorch`` -- Azure starts ``process_count_per_instance`` processes per node itself and
  sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK per node, RANK, LOCAL_RANK per process;
  no LOCAL_WORLD_SIZE, no node count;
* ``type: pytorch`` per node -- the same with one process a node, whose command is ``torchrun``;
* ``type: tensorflow`` -- Azure writes TF_CONFIG per worker (cluster.worker, task.index).

Every mode also gets the run's own AZUREML_* identity (DeepSpeed's Azure ML branch keys on
AZUREML_EXPERIMENT_ID).

What each launch (a mode, plain or through tb-launch or the guides' helper) must then hand the
script, and the judgement of what the processes saw against the real topology, are here too
(LAUNCH_SETS, topology_problems), so that they are unit-tested without containers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MASTER_PORT = 6105  # Azure ML's MASTER_PORT for type: pytorch (v1 guide)
BATCH_PORT = 6000  # the port in AZ_BATCH_MASTER_NODE (Batch's own: not for NCCL/gloo)
TF_PORT = 2222  # first TF_CONFIG worker port on each node
RUN = {
    "AZUREML_EXPERIMENT_ID": "3f0c6a52-tbconf",
    "AZUREML_RUN_ID": "tbconf_azureml_1",
    "AZUREML_ARM_WORKSPACE_NAME": "tbconf",
}


@dataclass(frozen=True)
class Process:
    """One process Azure ML starts itself: on which node, with which environment."""

    node: int
    env: dict[str, str]


def batch(ips: list[str]) -> dict[str, str]:
    """What AmlCompute's Batch layer gives every process of a multi-node `type: mpi` job."""
    return {
        "AZ_BATCH_MASTER_NODE": f"{ips[0]}:{BATCH_PORT}",
        "AZ_BATCHAI_MPI_MASTER_NODE": ips[0],
        "AZ_BATCH_HOST_LIST": ",".join(ips),
        "AZ_BATCH_NODE_LIST": ";".join(ips),
        **RUN,
    }


def pytorch(ips: list[str], per_node: int) -> list[Process]:
    """`type: pytorch`, process_count_per_instance = ``per_node``: one entry per process."""
    world = per_node * len(ips)
    return [
        Process(
            node,
            {
                "MASTER_ADDR": ips[0],
                "MASTER_PORT": str(MASTER_PORT),
                "WORLD_SIZE": str(world),
                "NODE_RANK": str(node),
                "RANK": str(node * per_node + local),
                "LOCAL_RANK": str(local),
                **RUN,
            },
        )
        for node in range(len(ips))
        for local in range(per_node)
    ]


def tensorflow(ips: list[str], per_node: int) -> list[Process]:
    """`type: tensorflow`, worker_count = nodes x ``per_node``: TF_CONFIG per worker."""
    workers = [f"{ip}:{TF_PORT + local}" for ip in ips for local in range(per_node)]
    return [
        Process(
            i // per_node,
            {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}), **RUN},
        )
        for i in range(len(workers))
    ]


# What each launch the tier runs hands the training script besides RANK, WORLD_SIZE and LOCAL_RANK
# (which the rendezvous probe requires of every one): (mode, wrapper) -> the variables it must set.
# A variable left out here may be absent, never wrong: where it is set it must be the real value.
LAUNCH_SETS: dict[tuple[str, str], frozenset[str]] = {
    # tb-launch takes both from the MPI launcher's local size (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS)
    ("mpi", "tb-launch"): frozenset({"NODE_RANK", "LOCAL_WORLD_SIZE"}),
    # the guides' helper sets RANK, WORLD_SIZE, LOCAL_RANK and MASTER_* only
    ("mpi", "guides-helper"): frozenset(),
    # Azure sets NODE_RANK per node and no LOCAL_WORLD_SIZE; tb-launch, seeing no node count, adds none
    ("pytorch", "plain"): frozenset({"NODE_RANK"}),
    ("pytorch", "tb-launch"): frozenset({"NODE_RANK"}),
    # tb-launch --tf reads both from Azure's TF_CONFIG (its workers' hosts are the nodes)
    ("tensorflow", "tb-launch"): frozenset({"NODE_RANK", "LOCAL_WORLD_SIZE"}),
}


def topology_problems(ranks: list[dict[str, Any]], hosts: list[str], per_node: int, sets: frozenset[str]) -> list[str]:
    """The rendezvous probe's lines (probes/rendezvous.py: each process's view and the table it
    gathered) against the real topology, ``per_node`` processes on each of ``hosts`` in order:
    rank r runs on node r // P (Azure places ranks by node), LOCAL_RANK is r % P, the world is
    N x P everywhere, every process gathered the same table; NODE_RANK and LOCAL_WORLD_SIZE are
    the node's index and P wherever set, and set wherever ``sets`` (LAUNCH_SETS) says the launch
    sets them. Empty when all of that holds."""
    n = per_node * len(hosts)
    if len(ranks) != n:
        return [f"{len(ranks)} of {n} processes reported: {ranks}"]
    problems = []
    for x in ranks:
        node = hosts.index(x["host"])
        where = f"rank {x['rank']} runs on node {node} ({x['host']})"
        got = {"world_size": x["world_size"], "node_of_rank": x["rank"] // per_node, "local_rank": x["local_rank"]}
        want = {"world_size": n, "node_of_rank": node, "local_rank": x["rank"] % per_node}
        for var, key, value in (("NODE_RANK", "node_rank", node), ("LOCAL_WORLD_SIZE", "local_world_size", per_node)):
            if x[key] is not None:
                got[key], want[key] = x[key], value
            elif var in sets:
                problems.append(f"{where}: no {var}, which this launch sets on every process")
        if got != want:
            problems.append(f"{where}: got {got}, want {want}")
    if len({repr(x["table"]) for x in ranks}) != 1:
        problems.append(f"processes gathered different tables: {ranks}")
    return problems
