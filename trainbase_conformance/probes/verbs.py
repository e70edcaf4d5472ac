"""Load libibverbs, librdmacm and the verbs providers named on the command line, then ask
libibverbs for its devices. One JSON object; never crashes on a host without RDMA.

usage: python verbs.py PROVIDER ..."""

import ctypes
import glob
import json
import os
import sys

out = {"libs": {}, "providers": {}}
verbs = None
for soname in ("libibverbs.so.1", "librdmacm.so.1"):
    try:
        lib = ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL, use_errno=True)
        out["libs"][soname] = "loaded"
        if soname == "libibverbs.so.1":
            verbs = lib
    except OSError as e:
        out["libs"][soname] = f"error: {e}"

# Providers live next to libibverbs: <libdir>/libibverbs/lib<name>-rdmav<ABI>.so, and each has
# a /etc/libibverbs.d/<name>.driver entry naming it.
libdir = None
if verbs is not None:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libibverbs.so"):
                libdir = os.path.dirname(os.path.realpath(path))
                break
for name in sys.argv[1:]:
    entry = {"driver_file": os.path.exists(f"/etc/libibverbs.d/{name}.driver")}
    found = sorted(glob.glob(f"{libdir}/libibverbs/lib{name}-rdmav*.so")) if libdir else []
    entry["plugin"] = found[0] if found else None
    if found:
        try:
            ctypes.CDLL(found[0])
            entry["load"] = "loaded"
        except OSError as e:
            entry["load"] = f"error: {e}"
    out["providers"][name] = entry

if verbs is not None:
    n = ctypes.c_int(-1)
    verbs.ibv_get_device_list.restype = ctypes.c_void_p
    lst = verbs.ibv_get_device_list(ctypes.byref(n))
    out["devices"] = n.value if lst else 0
    out["device_list_errno"] = 0 if lst else ctypes.get_errno()
    if lst:
        verbs.ibv_free_device_list(ctypes.c_void_p(lst))
print(json.dumps(out))
