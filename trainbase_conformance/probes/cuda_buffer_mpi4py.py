"""CUDA device buffers through MPI (mpi4py), value-checked: what a CUDA-aware MPI must take
without the user staging data through host memory.

Each rank allocates device memory with the CUDA runtime (ctypes, so no framework is needed:
base images have none) and hands it to mpi4py as an object with ``__cuda_array_interface__``,
the protocol mpi4py reads for GPU buffers (CuPy, Numba, PyTorch tensors export the same).
It then runs, on device buffers only:

  sendrecv   -- a ring: each rank sends N float64 of value rank+1 to the next rank
  allreduce  -- SUM of N float64 of value rank+1 (every element must be size*(size+1)/2)
  bcast      -- rank 0's buffer of 7.0 to every rank

after which each result is copied back to the host and checked element by element.
Ranks choose GPU local_rank % device count (one GPU serves every rank on a one-GPU host).

usage: mpirun -np N python cuda_buffer_mpi4py.py CUDART_SONAME [ELEMENTS]
Prints one ``TBCONF {json}`` line per rank; exits 1 on a wrong value or a CUDA error."""

import ctypes
import json
import os
import sys
from array import array

from mpi4py import MPI

cudart = ctypes.CDLL(sys.argv[1])
elements = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20  # 8 MiB of float64: past eager limits
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
out: dict = {"rank": rank, "size": size, "elements": elements, "library": MPI.Get_library_version().splitlines()[0]}
H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


cudart.cudaGetErrorString.restype = ctypes.c_char_p


def check(rc: int, call: str) -> None:
    if rc != 0:
        out.update(ok=False, error=f"{call} returned {rc} ({cudart.cudaGetErrorString(rc).decode()})")
        print("TBCONF " + json.dumps(out), flush=True)
        sys.exit(1)


class DeviceArray:
    """N float64 in device memory, exported through __cuda_array_interface__ (version 3)."""

    def __init__(self, n: int):
        self.n, self.ptr = n, ctypes.c_void_p()
        check(cudart.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(8 * n)), "cudaMalloc")

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": (self.n,),
            "typestr": "<f8",
            "data": (self.ptr.value, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def fill(self, value: float) -> None:
        host = array("d", [value]) * self.n
        addr, _ = host.buffer_info()
        check(cudart.cudaMemcpy(self.ptr, ctypes.c_void_p(addr), ctypes.c_size_t(8 * self.n), H2D), "cudaMemcpy H2D")

    def read(self) -> array:
        host = array("d", bytes(8 * self.n))
        addr, _ = host.buffer_info()
        check(cudart.cudaMemcpy(ctypes.c_void_p(addr), self.ptr, ctypes.c_size_t(8 * self.n), D2H), "cudaMemcpy D2H")
        return host


def wrong(got: array, want: float) -> list:
    """The first few (index, value) pairs that are not ``want``."""
    bad = []
    for i, v in enumerate(got):
        if v != want:
            bad.append((i, v))
            if len(bad) == 3:
                break
    return bad


count = ctypes.c_int()
check(cudart.cudaGetDeviceCount(ctypes.byref(count)), "cudaGetDeviceCount")
local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("MPI_LOCALRANKID") or rank)
out["device"] = local_rank % count.value
check(cudart.cudaSetDevice(out["device"]), "cudaSetDevice")

send, recv = DeviceArray(elements), DeviceArray(elements)
results: dict = {}

send.fill(rank + 1.0)
recv.fill(-1.0)
comm.Sendrecv(send, dest=(rank + 1) % size, recvbuf=recv, source=(rank - 1) % size)
prev = (rank - 1) % size + 1.0
results["sendrecv"] = wrong(recv.read(), prev)

recv.fill(-1.0)
comm.Allreduce(send, recv, op=MPI.SUM)
results["allreduce"] = wrong(recv.read(), size * (size + 1) / 2)

send.fill(7.0 if rank == 0 else -1.0)
comm.Bcast(send, root=0)
results["bcast"] = wrong(send.read(), 7.0)

out["wrong"] = {k: v for k, v in results.items() if v}
out["ok"] = not out["wrong"]
print("TBCONF " + json.dumps(out), flush=True)
sys.exit(0 if out["ok"] else 1)
