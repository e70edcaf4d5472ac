"""GPU tier probes through ctypes, so they need no compiler (the same on runtime images,
whose CUDA comes from wheels, and devel images):

  devices  -- driver/runtime versions and every device's name and compute capability
  kernel   -- a PTX kernel JIT-compiled by the driver writes 3*i+1; every element checked
  nccl     -- one-process NCCL all-reduce over all local GPUs (ncclCommInitAll): every
              element checked, algbw/busbw reported like nccl-tests

usage: python gpu_probe.py devices|kernel|nccl CUDART_SONAME [NCCL_SONAME]
Prints one JSON object; exits 1 when a check fails."""

import ctypes
import json
import sys
import time
from array import array

what, cudart_name = sys.argv[1], sys.argv[2]
out = {"probe": what}


def check(rc, call):
    if rc != 0:
        out["error"] = f"{call} returned {rc}"
        print(json.dumps(out))
        sys.exit(1)


cuda = ctypes.CDLL("libcuda.so.1")
cudart = ctypes.CDLL(cudart_name)

if what == "devices":
    v = ctypes.c_int()
    check(cuda.cuInit(0), "cuInit")
    check(cuda.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    out["driver"] = v.value
    check(cudart.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
    out["runtime"] = v.value
    n = ctypes.c_int()
    check(cudart.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    out["devices"] = []
    for i in range(n.value):
        dev, name = ctypes.c_int(), ctypes.create_string_buffer(256)
        major, minor = ctypes.c_int(), ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet")
        check(cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        check(cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "cuDeviceGetAttribute")  # CC major
        check(cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "cuDeviceGetAttribute")  # CC minor
        out["devices"].append({"index": i, "name": name.value.decode(), "cc": f"{major.value}.{minor.value}"})
    out["ok"] = n.value > 0

elif what == "kernel":
    PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry fill(.param .u64 out, .param .u32 n)
{
  .reg .pred p;
  .reg .b32 r<6>;
  .reg .b64 rd<5>;
  ld.param.u64 rd1, [out];
  ld.param.u32 r1, [n];
  mov.u32 r2, %ctaid.x;
  mov.u32 r3, %ntid.x;
  mov.u32 r4, %tid.x;
  mad.lo.s32 r2, r2, r3, r4;
  setp.ge.u32 p, r2, r1;
  @p bra DONE;
  cvta.to.global.u64 rd2, rd1;
  mul.wide.u32 rd3, r2, 4;
  add.s64 rd4, rd2, rd3;
  mad.lo.s32 r5, r2, 3, 1;
  st.global.u32 [rd4], r5;
DONE:
  ret;
}
\0"""
    n = 1 << 20
    dev, ctx, mod, fn = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    dptr = ctypes.c_uint64()
    check(cuda.cuInit(0), "cuInit")
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    check(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"fill"), "cuModuleGetFunction")
    check(cuda.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(4 * n)), "cuMemAlloc")
    arg_out, arg_n = ctypes.c_uint64(dptr.value), ctypes.c_uint32(n)
    params = (ctypes.c_void_p * 2)(
        ctypes.cast(ctypes.byref(arg_out), ctypes.c_void_p), ctypes.cast(ctypes.byref(arg_n), ctypes.c_void_p)
    )
    block = 256
    check(cuda.cuLaunchKernel(fn, (n + block - 1) // block, 1, 1, block, 1, 1, 0, None, params, None), "cuLaunchKernel")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    host = array("I", bytes(4 * n))
    check(
        cuda.cuMemcpyDtoH_v2(
            (ctypes.c_uint32 * n).from_buffer(host), ctypes.c_uint64(dptr.value), ctypes.c_size_t(4 * n)
        ),
        "cuMemcpyDtoH",
    )
    want = array("I", range(1, 3 * n + 1, 3))
    bad = 0 if host == want else sum(1 for a, b in zip(host, want) if a != b)
    out.update({"elements": n, "wrong": bad, "ok": bad == 0})
    cuda.cuMemFree_v2(ctypes.c_uint64(dptr.value))

elif what == "nccl":
    nccl = ctypes.CDLL(sys.argv[3])
    ndev = ctypes.c_int()
    check(cudart.cudaGetDeviceCount(ctypes.byref(ndev)), "cudaGetDeviceCount")
    n = ndev.value
    count = 32 << 20 >> 2  # 32 MiB of float32 per GPU
    comms = (ctypes.c_void_p * n)()
    devs = (ctypes.c_int * n)(*range(n))
    check(nccl.ncclCommInitAll(comms, n, devs), "ncclCommInitAll")
    bufs, streams = [], []
    for i in range(n):
        check(cudart.cudaSetDevice(i), "cudaSetDevice")
        b, s = ctypes.c_void_p(), ctypes.c_void_p()
        check(cudart.cudaMalloc(ctypes.byref(b), ctypes.c_size_t(4 * count)), "cudaMalloc")
        src = array("f", [float(i + 1)]) * count
        check(
            cudart.cudaMemcpy(b, (ctypes.c_float * count).from_buffer(src), ctypes.c_size_t(4 * count), 1),
            "cudaMemcpy H2D",
        )
        check(cudart.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        bufs.append(b)
        streams.append(s)

    def allreduce():
        check(nccl.ncclGroupStart(), "ncclGroupStart")
        for i in range(n):  # in place, ncclFloat32 = 7, ncclSum = 0
            check(
                nccl.ncclAllReduce(
                    bufs[i], bufs[i], ctypes.c_size_t(count), 7, 0, ctypes.c_void_p(comms[i]), streams[i]
                ),
                "ncclAllReduce",
            )
        check(nccl.ncclGroupEnd(), "ncclGroupEnd")
        for i in range(n):
            check(cudart.cudaSetDevice(i), "cudaSetDevice")
            check(cudart.cudaStreamSynchronize(streams[i]), "cudaStreamSynchronize")

    allreduce()  # one checked pass
    want = n * (n + 1) / 2
    bad = 0
    for i in range(n):
        check(cudart.cudaSetDevice(i), "cudaSetDevice")
        dst = array("f", bytes(4 * count))
        check(
            cudart.cudaMemcpy((ctypes.c_float * count).from_buffer(dst), bufs[i], ctypes.c_size_t(4 * count), 2),
            "cudaMemcpy D2H",
        )
        bad += count - dst.count(want)
    iters = 10
    t0 = time.perf_counter()
    for _ in range(iters):
        allreduce()
    dt = (time.perf_counter() - t0) / iters
    algbw = 4 * count / dt / 1e9
    out.update(
        {
            "gpus": n,
            "bytes": 4 * count,
            "wrong": bad,
            "ok": bad == 0,
            "time_us": round(dt * 1e6, 1),
            "algbw_GBps": round(algbw, 2),
            "busbw_GBps": round(algbw * 2 * (n - 1) / n, 2) if n > 1 else 0.0,
        }
    )
    for c in comms:
        nccl.ncclCommDestroy(ctypes.c_void_p(c))

print(json.dumps(out))
sys.exit(0 if out.get("ok") else 1)
