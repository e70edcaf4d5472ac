"""Which GPUs an image is built for: the GPU code each of its parts carries, read against a GPU's
compute capability with CUDA's compatibility rules. The catalogue's "built for" column and the
static tier's check of the frameworks' own wheels both use it.

The rules (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"):
- machine code (cubin, SASS) for ``sm_XY`` runs on compute capability X.Z for every Z >= Y of
  the same major X only: sm_80 runs on 8.6 and 8.9, never on 9.0;
- the architecture-specific ``sm_XYa`` runs on X.Y alone, the family-specific ``sm_XYf`` on X.Z
  for Z >= Y (CUDA 12.9's family targets);
- PTX (``compute_XY``) is JIT-compiled by the driver for any GPU of capability X.Y or newer, at
  the process's first use of the kernel (CUDA's JIT cache keeps it for the next start).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

CODE = re.compile(r"^(sm|compute)_([1-9][0-9]?)([0-9])([af]?)$")

MACHINE_CODE = "machine code"
PTX = "PTX"


def parse(code: str) -> tuple[str, tuple[int, int], str]:
    """``sm_90a`` -> ("sm", (9, 0), "a"); a string that is no GPU code raises ValueError."""
    m = CODE.match(code)
    if not m:
        raise ValueError(f"{code!r} is not GPU code as CUDA names it (sm_90, sm_90a, sm_100f, compute_90)")
    return m.group(1), (int(m.group(2)), int(m.group(3))), m.group(4)


def capability(arch: str) -> tuple[int, int]:
    """ "9.0" -> (9, 0)"""
    major, _, minor = arch.partition(".")
    return int(major), int(minor or 0)


def runs_as(codes: Iterable[str], arch: str) -> str | None:
    """How code of ``codes`` runs on a GPU of compute capability ``arch``: MACHINE_CODE where a
    cubin runs there, else PTX where some PTX JIT-compiles for it, else None (no kernel at all:
    CUDA's "no kernel image is available for execution on the device")."""
    cc = capability(arch)
    ptx = False
    for code in codes:
        kind, (major, minor), suffix = parse(code)
        if kind == "sm":
            if suffix == "a" and cc == (major, minor):
                return MACHINE_CODE
            if suffix != "a" and cc[0] == major and cc[1] >= minor:
                return MACHINE_CODE
        elif cc >= (major, minor):
            ptx = True
    return PTX if ptx else None


def built_for(
    architectures: Iterable[str], code: Mapping[str, Iterable[str]], refused: Mapping[str, str]
) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The image's GPUs: each of the row's ``architectures`` with how the image's GPU code runs
    there (machine code, or PTX where some part has only PTX for it), and those it is not built
    for with the reason -- a part's declared refusal, or a part with no code for it.
    ``code``: part -> its GPU code (a framework's wheel); parts with none are not listed."""
    served: list[tuple[str, str]] = []
    not_for: dict[str, str] = {}
    for arch in architectures:
        if arch in refused:
            not_for[arch] = refused[arch]
            continue
        ways = {part: runs_as(codes, arch) for part, codes in code.items()}
        missing = [part for part, how in ways.items() if how is None]
        if missing:
            not_for[arch] = f"{', '.join(missing)} carries no code for compute capability {arch}"
            continue
        jit = [part for part, how in ways.items() if how == PTX]
        served.append((arch, f"{PTX} ({', '.join(jit)})" if jit else MACHINE_CODE))
    return served, not_for
