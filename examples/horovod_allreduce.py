#!/usr/bin/env python3
"""Horovod (PyTorch): a value-checked hvd.allreduce.  mpirun -np 4 python horovod_allreduce.py"""

import os
import sys

import horovod.torch as hvd
import torch


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
    expected = size * (size + 1) / 2
    assert total == expected, f"rank {rank}: allreduce gave {total}, expected {expected}"
    os.write(1, (f"OK rank={rank} size={size} local_rank={hvd.local_rank()} allreduce={total:g}" + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
