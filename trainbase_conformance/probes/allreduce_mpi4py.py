"""Value-checked collectives through the image's mpi4py (no numpy needed): an object
allreduce, an 8 MiB buffer Allreduce (large-message shared-memory / network path) and a
Sendrecv ring of the same buffer (the single-copy path).

Prints one line per rank: TBCONF {"rank":..,"size":..,"library":..,"ok":..} and exits 1 on
any wrong value."""

import json
import socket
import sys
from array import array

from mpi4py import MPI

N = 1 << 20
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
bad = 0
if comm.allreduce(rank + 1, op=MPI.SUM) != size * (size + 1) // 2:
    bad += 1
pattern = array("d", range(1000))
send = array("d", (rank + 1 + pattern[i % 1000] for i in range(N)))
recv = array("d", bytes(8 * N))
comm.Allreduce(send, recv, op=MPI.SUM)
base = size * (size + 1) / 2
want = array("d", (base + size * pattern[i % 1000] for i in range(N)))
if recv != want:
    bad += sum(1 for a, b in zip(recv, want) if a != b)
prev, nxt = (rank - 1) % size, (rank + 1) % size
comm.Sendrecv(send, dest=nxt, sendtag=7, recvbuf=recv, source=prev, recvtag=7)
if recv != array("d", (prev + 1 + pattern[i % 1000] for i in range(N))):
    bad += 1
allbad = comm.allreduce(bad, op=MPI.SUM)
print(
    "TBCONF "
    + json.dumps(
        {
            "probe": "mpi4py",
            "rank": rank,
            "size": size,
            "host": socket.gethostname(),
            "bad": bad,
            "ok": allbad == 0,
            "library": MPI.Get_library_version().strip(),
            "mpi4py": __import__("mpi4py").__version__,
        }
    ),
    flush=True,
)
sys.exit(0 if allbad == 0 else 1)
