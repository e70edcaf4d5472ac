"""Intra-node (or inter-node) point-to-point speed through mpi4py, standard library only:
ping-pong latency (8 B) and bandwidth (64 KiB, 4 MiB) between ranks 0 and 1, and a 4 MiB
float64 Allreduce over every rank, each value-checked (every byte of a ping-pong's last round trip). The same file runs on the host (the
reference: Debian's Open MPI + python3-mpi4py) and in the image, so the two are comparable.

Rank 0 prints one line: TBSPEED {"library":..,"size":..,"lat_8B_us":..,"bw_64KiB_GBs":..,
"bw_4MiB_GBs":..,"allreduce_4MiB_ms":..,"pingpong_bytes":..}: pingpong_bytes is the payload every
ping-pong moved, for the check that intra-node payload stays off the network stack. Best of --reps timed rounds (noise on a shared
machine only ever makes a round slower). Exit 1 on a wrong value."""

import json
import sys
import time
from array import array

from mpi4py import MPI

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
# iterations per round are scaled by argv[2] (e.g. 0.05 between containers, where a TCP round
# trip costs tens of microseconds and 2000 of them per round take minutes on 2 cores)
SCALE = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
moved = 0  # payload bytes of every ping-pong message, both directions


def pingpong(nbytes: int, iters: int) -> float:
    """Seconds of one round trip, best of REPS rounds of ITERS round trips."""
    global moved
    iters = max(3, int(iters * SCALE))
    moved += 2 * nbytes * (iters * (REPS + 1) + 1)
    buf = bytearray(nbytes)
    best = float("inf")
    for _ in range(REPS + 1):  # the first round warms up (registration, page faults)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                comm.Send([buf, MPI.BYTE], dest=1, tag=1)
                comm.Recv([buf, MPI.BYTE], source=1, tag=2)
            elif rank == 1:
                comm.Recv([buf, MPI.BYTE], source=0, tag=1)
                comm.Send([buf, MPI.BYTE], dest=0, tag=2)
        dt = (time.perf_counter() - t0) / iters
        best = min(best, dt)
    # one more round trip, value-checked byte for byte: a transport that dropped or reordered
    # fragments must not pass as a fast one
    want = bytes(range(251)) * (nbytes // 251) + bytes(range(nbytes % 251))
    got = bytearray(nbytes)
    if rank == 0:
        comm.Send([bytearray(want), MPI.BYTE], dest=1, tag=3)
        comm.Recv([got, MPI.BYTE], source=1, tag=4)
    elif rank == 1:
        comm.Recv([got, MPI.BYTE], source=0, tag=3)
        comm.Send([got, MPI.BYTE], dest=0, tag=4)
    if rank in (0, 1) and got != want:
        print(f"rank {rank}: ping-pong of {nbytes} B delivered wrong bytes", file=sys.stderr)
        sys.exit(1)
    return comm.bcast(best, root=0)


def allreduce(n: int) -> float:
    send = array("d", [float(rank + 1)]) * n
    recv = array("d", [0.0]) * n
    best = float("inf")
    for _ in range(REPS + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], op=MPI.SUM)
        best = min(best, time.perf_counter() - t0)
    want = size * (size + 1) / 2
    if recv[0] != want or recv[-1] != want:
        print(f"rank {rank}: allreduce gave {recv[0]}, want {want}", file=sys.stderr)
        sys.exit(1)
    return comm.bcast(best, root=0)


lat = pingpong(8, 2000) / 2
bw64 = 64 * 1024 / (pingpong(64 * 1024, 400) / 2)
bw4m = 4 * 1024 * 1024 / (pingpong(4 * 1024 * 1024, 40) / 2)
ar = allreduce(4 * 1024 * 1024 // 8)
if rank == 0:
    print(
        "TBSPEED "
        + json.dumps(
            {
                "library": MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip(),
                "size": size,
                "lat_8B_us": round(lat * 1e6, 3),
                "bw_64KiB_GBs": round(bw64 / 1e9, 3),
                "bw_4MiB_GBs": round(bw4m / 1e9, 3),
                "allreduce_4MiB_ms": round(ar * 1e3, 3),
                "pingpong_bytes": moved,
            }
        ),
        flush=True,
    )
