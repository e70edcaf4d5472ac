"""One rank's view of the job, as a cluster runtime started it (runtime tier): the MPI world
(mpi4py: rank, size, an Allreduce of rank+1 checked against n(n+1)/2), the launch contract's
world (trainbase_launch.resolve() from whatever the launcher set: mpirun's, Slurm's, PMI's
variables), who runs it (uid, whether the uid has a passwd entry), which Python, and, where
the image has PyTorch, a 2-process gloo all-reduce through the launch contract's variables.
Prints ``TBWORLD {json}`` per rank; exit 1 on a wrong value. Standard library + mpi4py (+ torch
where present)."""

import json
import os
import pwd
import sys

import trainbase_launch
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1)
out = {
    "rank": rank,
    "size": size,
    "allreduce": total,
    "allreduce_ok": total == size * (size + 1) // 2,
    "uid": os.getuid(),
    "python": sys.executable,
    "prefix": sys.prefix,
}
try:
    out["user"] = pwd.getpwuid(os.getuid()).pw_name
except KeyError:
    out["user"] = None
try:
    w = trainbase_launch.resolve()
    out["launch"] = {
        "launcher": w.launcher,
        "rank": w.rank,
        "world_size": w.world_size,
        "local_rank": w.local_rank,
        "node_rank": w.node_rank,
    }
except trainbase_launch.LaunchError as e:
    out["launch"] = {"error": str(e)}
if "--torch" in sys.argv and size > 1 and "error" not in out["launch"]:
    import torch
    import torch.distributed as dist

    trainbase_launch.apply()
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # one node: the launch contract's master is this host
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    out["torch_allreduce"] = t.item()
    dist.barrier()
    dist.destroy_process_group()
print("TBWORLD " + json.dumps(out, sort_keys=True), flush=True)
sys.exit(0 if out["allreduce_ok"] else 1)
