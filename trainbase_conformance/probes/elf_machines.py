"""Which CPU architecture the image's programs and shared libraries are built for: every ELF
executable and shared object under the given roots, by its header's e_machine. One JSON object:
{"uname": "aarch64", "counts": {"183": N, ...}, "samples": {"62": [path, ...]}}.

usage: python elf_machines.py ROOT ...   (standard library only; runs in the image)

CUDA device code is ELF too (cubins, e_machine 190, EM_CUDA), and firmware blobs may be any
machine: only executables and shared objects (e_type 2 or 3) count, and EM_CUDA is skipped."""

import json
import os
import platform
import struct
import sys

ET_EXEC, ET_DYN, EM_CUDA = 2, 3, 190


def header(path):
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:
        return None
    return struct.unpack_from("<HH", head, 16)


def main(roots):
    counts, samples = {}, {}
    for root in roots:
        for d, _, files in os.walk(root):
            for name in files:
                p = os.path.join(d, name)
                if os.path.islink(p) or not os.path.isfile(p):
                    continue
                h = header(p)
                if h is None or h[0] not in (ET_EXEC, ET_DYN) or h[1] == EM_CUDA:
                    continue
                key = str(h[1])
                counts[key] = counts.get(key, 0) + 1
                if len(samples.setdefault(key, [])) < 10:
                    samples[key].append(p)
    print(json.dumps({"uname": platform.machine(), "counts": counts, "samples": samples}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["/opt", "/usr/local", "/usr/bin", "/usr/lib"])
