#!/usr/bin/env python3
"""PyTorch: a value-checked all_reduce and a few DDP steps whose parameters must end identical
on every rank. Works per-process (mpirun + tb-launch) and per-node (torchrun).

    mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a tb-launch python pytorch_ddp.py     # per process
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank N --master-addr a pytorch_ddp.py  # per node
Backend: nccl when GPUs are visible, else gloo (override with --backend).
"""

import argparse
import hashlib
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    if "RANK" not in os.environ:  # launched by mpirun without the wrapper
        import trainbase_launch

        trainbase_launch.apply()
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if a.backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    # 1. all_reduce: sum of (rank + 1) over ranks must be world * (world + 1) / 2
    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t.item() == expected, f"rank {rank}: all_reduce gave {t.item()}, expected {expected}"

    # 2. DDP: different data per rank, identical parameters afterwards
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(a.steps):
        x = torch.randn(32, 8, generator=g).to(device)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    digest = hashlib.sha256(repr(flat.tolist()).encode()).hexdigest()  # no numpy: torch does not need it
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    assert len(set(digests)) == 1, f"rank {rank}: parameters differ across ranks: {digests}"
    line = (
        f"OK rank={rank} world={world} local_rank={local_rank} "
        f"node_rank={os.environ.get('NODE_RANK', os.environ.get('GROUP_RANK'))} "
        f"host={socket.gethostname()} backend={a.backend} allreduce={t.item():g} params={digest[:12]}\n"
    )
    os.write(1, line.encode())  # one write: ranks sharing a pipe cannot interleave mid-line
    # Leave together: a rank that exits while rank 0 still serves the rendezvous store makes
    # rank 0 abort at shutdown ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
