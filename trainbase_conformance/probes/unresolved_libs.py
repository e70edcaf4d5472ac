"""Every ELF program and shared library under the given roots, asked of the dynamic linker
(`ldd`, with the image's own environment): which of their DT_NEEDED libraries resolve to
nothing. One JSON object: {"scanned": N, "unresolved": {path: [soname, ...]},
"shipped": {soname: [path, ...]}} -- where the image does carry a file of a missing library's
name (under the roots), for the caller to judge (a plugin whose host program loads it first).

usage: python unresolved_libs.py ROOT ...   (standard library only; runs in the image)

Only ELF files of this machine's architecture that the linker loads (executables and shared
objects) are asked; CUDA device code and other foreign ELF (cubins are ELF too) are not. Nor
are the libraries auditwheel vendors into a wheel's `<name>.libs/` folder: they are found at
run time through the RPATH of the extension module that loads them, not their own, so they are
asked through that module (ldd lists its whole tree, a missing vendored library included)."""

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ET_EXEC, ET_DYN = 2, 3
NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.M)


def elf_header(path):
    """(e_type, e_machine) of a little-endian ELF file, or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:
        return None
    return int.from_bytes(head[16:18], "little"), int.from_bytes(head[18:20], "little")


def candidates(roots, machine, names):
    seen = set()
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not (d.endswith(".libs") and "-packages" in top))
            for name in sorted(files):
                path = os.path.join(top, name)
                names.setdefault(name, []).append(path)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue  # a symlink's target is asked under its own name
                real = os.path.realpath(path)
                if real in seen:
                    continue
                seen.add(real)
                h = elf_header(path)
                if h and h[0] in (ET_EXEC, ET_DYN) and h[1] == machine:
                    yield path


def unresolved(path):
    try:
        p = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return path, ["(ldd timed out)"]
    # ldd of a static program exits 1 with "not a dynamic executable": nothing to resolve.
    return path, sorted(set(NOT_FOUND.findall(p.stdout)))


def main(roots):
    machine = elf_header("/proc/self/exe")  # this interpreter: the image's architecture
    names = {}
    paths = list(candidates([r for r in roots if os.path.isdir(r)], machine[1], names))
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        results = dict(r for r in pool.map(unresolved, paths) if r[1])
    shipped = {lib: names[lib] for libs in results.values() for lib in libs if lib in names}
    print(json.dumps({"scanned": len(paths), "unresolved": results, "shipped": shipped}, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
