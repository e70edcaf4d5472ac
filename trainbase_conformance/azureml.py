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
AZUREML_EXPERIMENT_ID)."""

from __future__ import annotations

import json
from dataclasses import dataclass

MASTER_PORT = 6105        # Azure ML's MASTER_PORT for type: pytorch (v1 guide)
BATCH_PORT = 6000         # the port in AZ_BATCH_MASTER_NODE (Batch's own: not for NCCL/gloo)
TF_PORT = 2222            # first TF_CONFIG worker port on each node
RUN = {"AZUREML_EXPERIMENT_ID": "3f0c6a52-tbconf", "AZUREML_RUN_ID": "tbconf_azureml_1",
       "AZUREML_ARM_WORKSPACE_NAME": "tbconf"}


@dataclass(frozen=True)
class Process:
    """One process Azure ML starts itself: on which node, with which environment."""

    node: int
    env: dict[str, str]


def batch(ips: list[str]) -> dict[str, str]:
    """What AmlCompute's Batch layer gives every process of a multi-node `type: mpi` job."""
    return {"AZ_BATCH_MASTER_NODE": f"{ips[0]}:{BATCH_PORT}", "AZ_BATCHAI_MPI_MASTER_NODE": ips[0],
            "AZ_BATCH_HOST_LIST": ",".join(ips), "AZ_BATCH_NODE_LIST": ";".join(ips), **RUN}


def pytorch(ips: list[str], per_node: int) -> list[Process]:
    """`type: pytorch`, process_count_per_instance = ``per_node``: one entry per process."""
    world = per_node * len(ips)
    return [Process(node, {"MASTER_ADDR": ips[0], "MASTER_PORT": str(MASTER_PORT), "WORLD_SIZE": str(world),
                           "NODE_RANK": str(node), "RANK": str(node * per_node + local),
                           "LOCAL_RANK": str(local), **RUN})
            for node in range(len(ips)) for local in range(per_node)]


def tensorflow(ips: list[str], per_node: int) -> list[Process]:
    """`type: tensorflow`, worker_count = nodes x ``per_node``: TF_CONFIG per worker."""
    workers = [f"{ip}:{TF_PORT + local}" for ip in ips for local in range(per_node)]
    return [Process(i // per_node, {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                             "task": {"type": "worker", "index": i}}), **RUN})
            for i in range(len(workers))]
