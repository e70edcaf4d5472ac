"""Which shared libraries the image carries more than once: every regular ELF shared object on
the root filesystem (-xdev; /proc, /sys, /dev and /tmp skipped) whose name is *.so or *.so.*,
by its DT_SONAME, read from the dynamic section with struct (32/64-bit, either byte order; no
readelf). Symlinks and hard links are one copy (by realpath and inode); only files built for
this interpreter's ELF class and machine count (an i386 libc beside the amd64 one is not a
second copy of it). One JSON object:

    {"scanned": N, "seconds": S, "duplicates": {soname: [{"path": P, "size": BYTES}, ...]},
     "loader_cache": {soname: [P, ...]}}

with only the sonames present as 2 or more distinct files (and "sha256", the first 16 hex
digits, where they are all the same size: identical copies show as such). ``loader_cache``: for
each of those sonames, which of its copies the dynamic linker's cache (ROOT/etc/ld.so.cache, as
``ldconfig -p`` lists it) holds, in the order a lookup by soname tries them -- a ``dlopen`` by
name or a DT_NEEDED no RUNPATH answers gets the first; absent where the image has no cache or
no ldconfig.

usage: python sonames.py [ROOT]   (standard library only; runs in the image; ROOT defaults to /)"""

import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import time

SKIP = ("/proc", "/sys", "/dev", "/tmp")
LIBRARY_NAME = re.compile(r"\.so(\.[^/]*)?$")
ET_DYN, PT_LOAD, PT_DYNAMIC, DT_NULL, DT_STRTAB, DT_SONAME = 3, 1, 2, 0, 5, 14


def ident(head):
    """(class, byte order, e_machine) of an ELF header, or None: class 1/2 is 32/64-bit, byte
    order "<" or ">"."""
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    order = "<" if head[5] == 1 else ">"
    return head[4], order, struct.unpack_from(order + "H", head, 18)[0]


def soname(f):
    """DT_SONAME of the open ELF file ``f`` when it is a shared object (e_type ET_DYN), or None."""
    head = f.read(64)
    elf = ident(head)
    if elf is None or len(head) < (64 if elf[0] == 2 else 52):
        return None
    cls, o = elf[0], elf[1]
    if struct.unpack_from(o + "H", head, 16)[0] != ET_DYN:
        return None
    if cls == 2:
        phoff, phentsize, phnum = struct.unpack_from(o + "Q", head, 32)[0], *struct.unpack_from(o + "HH", head, 54)
        phdr, dyn = o + "IIQQQQQQ", o + "qQ"  # p_type p_flags p_offset p_vaddr p_paddr p_filesz ...
    else:
        phoff, phentsize, phnum = struct.unpack_from(o + "I", head, 28)[0], *struct.unpack_from(o + "HH", head, 42)
        phdr, dyn = o + "IIIIIIII", o + "iI"  # p_type p_offset p_vaddr p_paddr p_filesz p_memsz ...
    if not phnum or phentsize < struct.calcsize(phdr) or phnum > 4096:
        return None
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads, dynamic = [], None
    for i in range(min(phnum, len(table) // phentsize)):
        p = struct.unpack_from(phdr, table, i * phentsize)
        seg = (p[0], p[2], p[3], p[5]) if cls == 2 else (p[0], p[1], p[2], p[4])  # type offset vaddr filesz
        if seg[0] == PT_LOAD:
            loads.append(seg[1:])
        elif seg[0] == PT_DYNAMIC:
            dynamic = seg[1:]
    if dynamic is None:
        return None
    f.seek(dynamic[0])
    data = f.read(min(dynamic[2], 1 << 20))
    size = struct.calcsize(dyn)
    strtab = name_at = None
    for i in range(len(data) // size):
        tag, val = struct.unpack_from(dyn, data, i * size)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = val
        elif tag == DT_SONAME:
            name_at = val
    if strtab is None or name_at is None:
        return None
    # DT_STRTAB is an address: its file offset is its distance into the PT_LOAD segment holding it
    offset = next((off + strtab - va for off, va, filesz in loads if va <= strtab < va + filesz), None)
    if offset is None:
        return None
    f.seek(offset + name_at)
    raw = f.read(256).split(b"\0", 1)[0]
    return raw.decode("utf-8", "replace") or None


def libraries(root, native):
    """(soname, realpath, size) of every distinct shared object under ``root`` built for
    ``native`` ((class, byte order, machine))."""
    dev = os.lstat(root).st_dev
    seen, found = set(), []
    skip = {os.path.join(root, s.lstrip("/")) for s in SKIP}
    for top, dirs, files in os.walk(root):
        keep = []
        for d in dirs:
            p = os.path.join(top, d)
            try:
                if p not in skip and os.lstat(p).st_dev == dev:  # -xdev
                    keep.append(d)
            except OSError:
                pass
        dirs[:] = keep
        for name in sorted(files):
            if not LIBRARY_NAME.search(name):
                continue
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue  # a symlink is its target's name; a hard link the same file
            seen.add((st.st_dev, st.st_ino))
            try:
                with open(path, "rb") as f:
                    head = f.read(20)
                    if ident(head) != native:
                        continue
                    f.seek(0)
                    so = soname(f)
            except (OSError, struct.error):
                continue
            if so:
                found.append((so, os.path.realpath(path), st.st_size))
    return found


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def duplicates(found):
    """{soname: [{"path", "size"[, "sha256"]}, ...]} of the sonames found as 2 or more files;
    where all of a soname's files are the same size, the start of each one's sha256 too (the
    same bytes twice, e.g. a wheel's libmpi.so, .so.12 and .so.12.0.0 unpacked as files)."""
    by = {}
    for so, path, size in found:
        by.setdefault(so, {})[path] = size
    out = {}
    for so, files in sorted(by.items()):
        if len(files) < 2:
            continue
        same_size = len(set(files.values())) == 1
        out[so] = [
            {"path": p, "size": n, **({"sha256": digest(p)} if same_size else {})} for p, n in sorted(files.items())
        ]
    return out


CACHE_LINE = re.compile(r"^\s+(\S+) \(([^)]*)\) => (\S+)$")


def loader_cache(root, dups):
    """{soname: [realpath, ...]} of the copies in ``dups`` that the image's ld.so.cache lists,
    in its order; None where it has no cache or no ldconfig to read it."""
    cache = os.path.join(root, "etc/ld.so.cache")
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if not os.path.isfile(cache) or ldconfig is None:
        return None
    listed = subprocess.run([ldconfig, "-p", "-C", cache], capture_output=True, text=True, check=False).stdout
    copies = {so: {f["path"] for f in files} for so, files in dups.items()}
    out = {}
    for line in listed.splitlines():
        m = CACHE_LINE.match(line)
        if not m or m.group(1) not in copies:
            continue
        path = os.path.realpath(os.path.join(root, m.group(3).lstrip("/")))
        if path in copies[m.group(1)] and path not in out.setdefault(m.group(1), []):
            out[m.group(1)].append(path)  # only this interpreter's class: those are the scanned copies
    return out


def main(root="/"):
    t0 = time.monotonic()
    with open(os.path.realpath(sys.executable), "rb") as f:
        native = ident(f.read(20))
    found = libraries(root, native)
    dups = duplicates(found)
    out = {"scanned": len(found), "seconds": round(time.monotonic() - t0, 1), "duplicates": dups}
    cache = loader_cache(root, dups)
    if cache is not None:
        out["loader_cache"] = cache
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(*sys.argv[1:2])
