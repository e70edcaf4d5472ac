"""GDRCopy's userspace library as a process of the image gets it: loaded by soname through the
dynamic linker (the image's ld.so.conf), its version asked of the loaded file
(gdr_runtime_get_version: GDR_API_MAJOR/MINOR_VERSION of the build), the file found in
/proc/self/maps. Needs no GPU and no gdrdrv: only gdr_open talks to the driver. Python 3.8+.

    python gdrapi.py libgdrapi.so.2   ->   {"version": "2.6", "path": "/opt/gdrcopy/lib/libgdrapi.so.2.6"}
"""

import ctypes
import json
import sys


def main() -> None:
    soname = sys.argv[1]
    try:
        lib = ctypes.CDLL(soname)
    except OSError as e:
        print(json.dumps({"error": str(e)}))
        return
    try:
        get_version = lib.gdr_runtime_get_version
    except AttributeError as e:
        print(json.dumps({"error": f"exports no gdr_runtime_get_version: {e}"}))
        return
    major, minor = ctypes.c_int(-1), ctypes.c_int(-1)
    get_version(ctypes.byref(major), ctypes.byref(minor))
    with open("/proc/self/maps") as maps:
        path = next((ln.split()[-1] for ln in maps if "libgdrapi" in ln and "/" in ln), None)
    print(json.dumps({"version": f"{major.value}.{minor.value}", "path": path}))


if __name__ == "__main__":
    main()
