#!/usr/bin/env python3
"""The Lightning recipes of Azure ML's walkthrough, as users write them: no `tb-launch`.

    # per node: MPI starts ONE process a node (Azure ML: process_count_per_node=1);
    # Lightning must start the `devices` processes of each node itself
    mpirun -np 2 -H a:1,b:1 -x AZ_BATCHAI_MPI_MASTER_NODE=a python lightning_azureml.py per-node --devices 2 --num-nodes 2
    # per process: MPI starts every process (process_count_per_node=devices)
    mpirun -np 4 -H a:2,b:2 python lightning_azureml.py per-process --devices 2 --num-nodes 2

Per node, the script does what the walkthrough says before it builds the Trainer: MASTER_ADDR
from AZ_BATCHAI_MPI_MASTER_NODE, a MASTER_PORT, NODE_RANK from the MPI rank. Every process
that trains prints one `OK rank=.. world=.. ...` line; the world must be devices x num_nodes
and the parameters identical everywhere. A launch that cannot give that world must stop: the
process prints `FAIL rank=.. reason=..` and exits 1 (the image's patched Lightning names the
fix). Never a smaller world with exit 0.
"""

import argparse
import os
import sys
import warnings

import lightning as L
import torch
from lightning_ddp import TinyRegression, parameters_agree  # the same model and check, beside this file


def mpi_rank() -> str:
    """The launcher's rank of this process (Open MPI, then Intel MPI/MPICH)."""
    return os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or "?"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["per-node", "per-process"])
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--num-nodes", type=int, required=True)
    ap.add_argument("--master-port", default="6105")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    if a.mode == "per-node" and "LOCAL_RANK" not in os.environ:  # Lightning's children inherit these
        os.environ["MASTER_ADDR"] = os.environ["AZ_BATCHAI_MPI_MASTER_NODE"]
        os.environ["MASTER_PORT"] = a.master_port
        os.environ["NODE_RANK"] = mpi_rank()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    data = torch.utils.data.TensorDataset(torch.randn(256, 8, generator=torch.Generator().manual_seed(7)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    trainer = L.Trainer(
        accelerator="auto",
        strategy="ddp",
        devices=a.devices,
        num_nodes=a.num_nodes,
        max_steps=a.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyRegression()
    try:
        trainer.fit(model, loader)
    except ValueError as e:
        os.write(1, f"FAIL rank={mpi_rank()} reason={' '.join(str(e).split())}\n".encode())
        return 1

    env = type(trainer.strategy.cluster_environment).__name__
    world, rank = trainer.world_size, trainer.global_rank
    want = a.devices * a.num_nodes
    if world != want:
        os.write(
            1,
            f"FAIL rank={mpi_rank()} reason=Lightning trained a world of {world}, "
            f"devices x num_nodes = {want} ({env})\n".encode(),
        )
        return 1
    digest = parameters_agree(model, world, rank)
    os.write(
        1,
        (
            f"OK rank={rank} world={world} node_rank={trainer.node_rank} local_rank={trainer.local_rank} "
            f"env={env} params={digest[:12]}\n"
        ).encode(),
    )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # see lightning_ddp.py: no group alive at exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
