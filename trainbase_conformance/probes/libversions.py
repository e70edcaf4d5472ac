"""Load CUDA-stack libraries with ctypes (no GPU, no driver needed) and report their
versions and the file each one was really loaded from, as one JSON object.

usage: python libversions.py NAME=SONAME ...   NAME in cudart, cublas, cudnn, nccl, gdrcopy"""

import ctypes
import json
import sys


def loaded_from(soname):
    """The file the dynamic linker mapped for ``soname`` (what the process really uses)."""
    stem = soname.split(".so")[0] + ".so"
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/" in path and path.rsplit("/", 1)[-1].startswith(stem):
                return path
    return None


def fail(msg):
    raise RuntimeError(msg)


def query(name, lib):
    v = ctypes.c_int(0)
    if name == "cudart":
        rc = lib.cudaRuntimeGetVersion(ctypes.byref(v))
        return v.value if rc == 0 else fail(f"cudaRuntimeGetVersion returned {rc}")
    if name == "nccl":
        rc = lib.ncclGetVersion(ctypes.byref(v))
        return v.value if rc == 0 else fail(f"ncclGetVersion returned {rc}")
    if name == "cudnn":
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        return int(lib.cudnnGetVersion())
    if name == "cublas":
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            rc = lib.cublasGetProperty(prop, ctypes.byref(v))
            if rc != 0:
                return fail(f"cublasGetProperty returned {rc}")
            parts.append(v.value)
        return ".".join(map(str, parts))
    if name == "gdrcopy":  # GDR_API_MAJOR/MINOR_VERSION of the build; no gdrdrv needed
        major, minor = ctypes.c_int(-1), ctypes.c_int(-1)
        lib.gdr_runtime_get_version(ctypes.byref(major), ctypes.byref(minor))
        return f"{major.value}.{minor.value}"
    raise SystemExit(f"unknown library {name}")


out = {}
for arg in sys.argv[1:]:
    name, soname = arg.split("=", 1)
    try:
        lib = ctypes.CDLL(soname)
    except OSError as e:
        out[name] = {"soname": soname, "error": str(e)}
        continue
    try:
        out[name] = {"soname": soname, "version": query(name, lib), "path": loaded_from(soname)}
    except (AttributeError, RuntimeError) as e:
        out[name] = {"soname": soname, "error": str(e), "path": loaded_from(soname)}
print(json.dumps(out))
