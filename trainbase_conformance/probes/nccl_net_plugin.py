"""What NCCL asks of a network plugin, and what the plugin files give, from the libraries
themselves: one JSON object on stdout.

usage: python nccl_net_plugin.py [--init] PLUGIN ...   (standard library only; runs in the image)

- "nccl": the libnccl.so.2 the dynamic linker loads, and the plugin interface versions it looks
  up: NCCL calls dlsym() with each symbol name as a string literal, newest first
  (ncclNetPlugin_v12 ... _v6 in 2.30; _v10 ... _v6 in 2.27), so the names are in the file.
- "plugins": each file dlopened as NCCL opens it (RTLD_NOW | RTLD_LOCAL), and the net and tuner
  interface versions it exports.
- "init" (--init): the first plugin's ncclNetPlugin_v8.init() called with a logger that records
  NCCL_OFI's messages: its return code (0 = ncclSuccess) and what it logged. The v6-v9 struct
  starts {const char *name; ncclResult_t (*init)(ncclDebugLogger_t);}."""

import ctypes
import json
import os
import re
import sys

RTLD_NOW = 2
MAX_VERSION = 32


def loaded_path(handle_name):
    """The file /proc/self/maps shows for a library loaded under ``handle_name``'s soname."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if os.path.basename(path).startswith(handle_name):
                return os.path.realpath(path)
    return None


def asked_by_nccl():
    try:
        ctypes.CDLL("libnccl.so.2")
    except OSError as e:
        return {"error": str(e)}
    path = loaded_path("libnccl.so")
    with open(path, "rb") as f:
        data = f.read()
    versions = {
        kind: sorted({int(v) for v in re.findall(rb"%s_v(\d+)\x00" % name.encode(), data)}, reverse=True)
        for kind, name in (("net", "ncclNetPlugin"), ("tuner", "ncclTunerPlugin"))
    }
    return {"path": path, **versions}


def exported(path):
    try:
        lib = ctypes.CDLL(path, mode=RTLD_NOW | os.RTLD_LOCAL)
    except OSError as e:
        return None, {"load": f"error: {e}", "net": [], "tuner": []}
    out = {"load": "loaded"}
    for kind, name in (("net", "ncclNetPlugin"), ("tuner", "ncclTunerPlugin")):
        out[kind] = [v for v in range(MAX_VERSION, 0, -1) if hasattr(lib, f"{name}_v{v}")]
    return lib, out


def init(lib):
    log = []
    logger_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)

    def logger(level, flags, file, line, fmt):
        # the format string only: the varargs are not read (ctypes callbacks are not variadic)
        log.append(f"[{level}] {(fmt or b'').decode(errors='replace')}")

    keep = logger_t(logger)

    class NetV8(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("init", ctypes.CFUNCTYPE(ctypes.c_int, logger_t))]

    net = NetV8.in_dll(lib, "ncclNetPlugin_v8")
    rc = net.init(keep)
    return {"name": net.name.decode(), "rc": rc, "log": log}


def main(argv):
    do_init = "--init" in argv
    paths = [a for a in argv if a != "--init"]
    out = {"nccl": asked_by_nccl(), "plugins": {}}
    first = None
    for p in paths:
        lib, info = exported(p)
        out["plugins"][p] = info
        first = first or lib
    if do_init and first is not None and hasattr(first, "ncclNetPlugin_v8"):
        sys.stdout.flush()
        out["init"] = init(first)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
