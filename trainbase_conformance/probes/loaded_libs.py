"""Which NCCL, cuDNN and UCX a process of the image really loads, and their versions, asked of
those very files with ctypes (no GPU, no driver needed). One JSON object, one entry per NAME:

    {"nccl": {"soname": S, "via": "torch" | "linker", "path": P, "version": "2.27.5", "code": 22705},
     "ucx": {"via": "/opt/openmpi/lib/openmpi/mca_pml_ucx.so", "path": P, "version": "1.20.1"} ...}

or {"error": ...} where it does not load, {"absent": ...} where the MPI links no UCX.

usage: python loaded_libs.py [--import MODULE]... nccl=libnccl.so.2 cudnn=libcudnn.so.9 ucx=KIND:MPI_PREFIX

* nccl / cudnn: after ``import MODULE`` (torch, tensorflow: a framework image) the file of that
  soname in /proc/self/maps, the one the framework loaded; where no framework loaded it (a base
  image, or a framework that loads it lazily), the one ``ctypes.CDLL(soname)`` gets from the
  dynamic linker. Its version from that same file: ncclGetVersion, cudnnGetVersion.
* ucx: the library of the MPI (KIND openmpi or intelmpi) under MPI_PREFIX that loads UCX --
  Open MPI's pml ucx component (mca_pml_ucx.so), else libmpi itself (a build with static
  components, as the Open MPI wheel); Intel MPI's libfabric mlx provider (libmlx-fi.so) -- and
  the libucp.so.0 that ``ldd`` resolves for it, in the image's environment; its version from
  ucp_get_version."""

import ctypes
import fnmatch
import json
import os
import re
import subprocess
import sys

# the UCX users of each MPI, most specific first: the first kind found under the prefix is asked
UCX_USERS = {"openmpi": ("mca_pml_ucx.so", "libmpi.so*"), "intelmpi": ("libmlx-fi.so",)}
LIBUCP = "libucp.so.0"


def mapped(soname):
    """The file mapped into this process whose name is ``soname`` or a versioned name of it
    (libnccl.so.2 -> libnccl.so.2.27.5), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            name = path.rsplit("/", 1)[-1]
            if "/" in path and (name == soname or name.startswith(soname + ".")):
                return path
    return None


def dotted(name, code):
    """The version a library's integer code stands for (NCCL from 2.9 and cuDNN from 9 put the
    major at x10000, older ones at x1000)."""
    big = code >= (10000 if name == "nccl" else 90000)
    major, rest = divmod(code, 10000 if big else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def version_of(name, path):
    lib = ctypes.CDLL(path)
    if name == "nccl":
        v = ctypes.c_int(0)
        rc = lib.ncclGetVersion(ctypes.byref(v))
        if rc != 0:
            raise RuntimeError(f"ncclGetVersion returned {rc}")
        return {"version": dotted(name, v.value), "code": v.value}
    if name == "cudnn":
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        code = int(lib.cudnnGetVersion())
        return {"version": dotted(name, code), "code": code}
    parts = [ctypes.c_uint(0) for _ in range(3)]
    lib.ucp_get_version(*(ctypes.byref(p) for p in parts))
    return {"version": ".".join(str(p.value) for p in parts)}


def loaded(name, soname, frameworks):
    """The file the process loads for ``soname`` (a framework's, else the linker's) and its version."""
    out = {"soname": soname, "via": ",".join(frameworks) or "linker", "path": mapped(soname)}
    if out["path"] is None:
        out["via"] = "linker"
        try:
            ctypes.CDLL(soname)
        except OSError as e:
            return {**out, "error": str(e)}
        out["path"] = mapped(soname)
    try:
        return {**out, **version_of(name, out["path"])}
    except (OSError, AttributeError, RuntimeError, TypeError) as e:
        return {**out, "error": f"{type(e).__name__}: {e}"}


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def ucx_user(patterns, prefix):
    """The MPI's library that loads UCX (the first of ``patterns`` an ELF file under ``prefix``
    matches: a libmpi.so that is a linker script is not the library), or None."""
    found = {}
    for top, dirs, files in os.walk(prefix):
        dirs.sort()
        for name in sorted(files):
            for i, pattern in enumerate(patterns):
                if i not in found and fnmatch.fnmatchcase(name, pattern) and is_elf(os.path.join(top, name)):
                    found[i] = os.path.join(top, name)
    return found[min(found)] if found else None


def ucx(kind_prefix):
    kind, _, prefix = kind_prefix.partition(":")
    patterns = UCX_USERS.get(kind, ())
    user = ucx_user(patterns, prefix) if patterns else None
    if user is None:
        return {"absent": f"no {' or '.join(patterns) or 'UCX user known'} for {kind} under {prefix}"}
    try:
        ldd = subprocess.run(["ldd", user], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"via": user, "error": f"ldd {user}: {e}"}
    m = re.search(rf"^\s*{re.escape(LIBUCP)}\s+=>\s+(\S+)", ldd.stdout, re.M)
    if m is None:
        return {"absent": f"{user} links no {LIBUCP}", "via": user}
    if m.group(1) == "not":
        return {"via": user, "error": f"{LIBUCP} of {user} => not found"}
    path = os.path.realpath(m.group(1))
    try:
        return {"via": user, "path": path, **version_of("ucx", path)}
    except (OSError, AttributeError) as e:
        return {"via": user, "path": path, "error": f"{type(e).__name__}: {e}"}


def main(args):
    frameworks, out = [], {}
    while args[:1] == ["--import"]:
        frameworks.append(args[1])
        args = args[2:]
    for module in frameworks:
        try:
            mod = __import__(module)
            if module == "torch":  # NCCL and cuDNN, should this torch load them lazily
                mod.cuda.nccl.version()
                mod.backends.cudnn.version()
        except Exception as e:  # noqa: BLE001 -- any failure is the answer
            out["import"] = f"import {module}: {type(e).__name__}: {e}"
    for arg in args:
        name, value = arg.split("=", 1)
        out[name] = ucx(value) if name == "ucx" else loaded(name, value, frameworks)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
