"""Horovod's GPU data path: all-reduce, all-gather and broadcast of CUDA tensors through its
NCCL operations, each value-checked, then the all-reduce's throughput. Run one process per GPU
(mpirun / horovodrun / tb-launch). Prints one JSON line per rank; exits 1 on a wrong value.

A Horovod built without GPU operations fails at the first all-reduce of a CUDA tensor ("Requested
ReadyEvent with GPU device but not compiled with CUDA"): this says so before trying."""

import json
import os
import sys
import time

import horovod.torch as hvd
import torch

hvd.init()
rank, size, local = hvd.rank(), hvd.size(), hvd.local_rank()
out = {
    "probe": "horovod_gpu",
    "rank": rank,
    "size": size,
    "local_rank": local,
    "cuda_built": bool(hvd.cuda_built()),
    "nccl_built": int(hvd.nccl_built() or 0),
}
if not (out["cuda_built"] and out["nccl_built"]):
    out["error"] = "Horovod was built without CUDA/NCCL operations: it cannot all-reduce a CUDA tensor"
    print(json.dumps(out), flush=True)
    sys.exit(1)
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
ok = True
# all-reduce (sum) of rank+1 on every rank: size*(size+1)/2 everywhere
t = torch.full((1 << 20,), float(rank + 1), device=dev)
r = hvd.allreduce(t, op=hvd.Sum, name="probe.allreduce")
want = size * (size + 1) / 2
out["allreduce_ok"] = bool(r.is_cuda and torch.all(r == want))
# all-gather: each rank contributes its rank in a row
g = hvd.allgather(torch.full((2, 3), float(rank), device=dev), name="probe.allgather")
out["allgather_ok"] = bool(g.shape == (2 * size, 3) and all(torch.all(g[2 * i : 2 * i + 2] == i) for i in range(size)))
# broadcast from the last rank
b = hvd.broadcast(torch.full((1024,), float(rank), device=dev), root_rank=size - 1, name="probe.broadcast")
out["broadcast_ok"] = bool(torch.all(b == size - 1))
ok = out["allreduce_ok"] and out["allgather_ok"] and out["broadcast_ok"]
# throughput: 64 MiB fp32 all-reduces (algorithm bandwidth: bytes / time per all-reduce)
x = torch.ones((16 << 20,), device=dev)
for i in range(3):
    hvd.allreduce(x, op=hvd.Sum, name=f"probe.warm{i}")
torch.cuda.synchronize()
n = 10
t0 = time.perf_counter()
for i in range(n):
    y = hvd.allreduce(x, op=hvd.Sum, name=f"probe.bw{i}")
torch.cuda.synchronize()
dt = (time.perf_counter() - t0) / n
out["allreduce_64MiB_ms"] = round(dt * 1e3, 3)
out["algbw_GBps"] = round(x.numel() * 4 / dt / 1e9, 1)
out["bw_value_ok"] = bool(torch.all(y == size))
ok = ok and out["bw_value_ok"]
out["ok"] = ok
out["nccl_debug_hint"] = os.environ.get("NCCL_DEBUG", "")
print(json.dumps(out), flush=True)
sys.exit(0 if ok else 1)
