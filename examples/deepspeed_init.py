#!/usr/bin/env python3
"""DeepSpeed under mpirun without the DeepSpeed launcher (what Azure ML's guide requires):
init_distributed discovers the MPI world; rank/world are checked against the launcher's
own variables and a gloo collective is value-checked.

    mpirun -np 4 python deepspeed_init.py
"""

import os
import sys

import deepspeed
import torch
import torch.distributed as dist


def launcher_rank() -> tuple[int, int]:
    for r, s in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def main() -> int:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    want = launcher_rank()
    assert (rank, world) == want, f"deepspeed sees rank {rank}/{world}, the launcher says {want[0]}/{want[1]}"
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t.item()
    os.write(
        1,
        (
            f"OK rank={rank} world={world} local_rank={os.environ.get('LOCAL_RANK')} allreduce={t.item():g}" + "\n"
        ).encode(),
    )
    # Leave together, then tear down torch before MPI finalizes at exit: a rank that leaves
    # while others still use the gloo group makes them fail at shutdown.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
