"""OCI architectures and this host's: the one mapping the build (trainbase_common/emulation.py)
and the conformance suite (trainbase_conformance/emulation.py) share."""

from __future__ import annotations

import platform

# OCI architecture -> `uname -m` (and PyPI's wheel platform suffix)
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


# The CPUs an emulated image of that architecture runs on, as qemu CPU models: the arm64 CPUs of
# GPU servers. qemu's default CPU ("max") has 512-bit SVE vectors, which no GPU server has, and
# code built for a fixed vector length (PyTorch inductor's -msve-vector-bits=256) crashes there:
# the suite would be testing a CPU nobody runs. Grace (GH200, GB200) is Neoverse V2: Armv9,
# SVE2 at 128 bits, bf16, i8mm, which qemu's neoverse-n2 model has; Graviton3 (AWS) is
# Neoverse V1, SVE at 256 bits. The first is what every emulated container is started with
# (QEMU_CPU); a check whose outcome depends on the vector ISA runs once per CPU listed.
EMULATED_CPUS: dict[str, tuple[tuple[str, str], ...]] = {
    "arm64": (("Grace (Neoverse V2)", "neoverse-n2"), ("Graviton3 (Neoverse V1)", "neoverse-v1")),
}


def host_arch() -> str:
    """This machine's OCI architecture (amd64, arm64)."""
    m = platform.machine()
    return {v: k for k, v in MACHINES.items()}.get(m, m)
