"""OCI architectures and this host's: the one mapping the build (trainbase/build/emulation.py)
and the conformance suite (trainbase_conformance/emulation.py) share."""
from __future__ import annotations

import platform

# OCI architecture -> `uname -m` (and PyPI's wheel platform suffix)
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_arch() -> str:
    """This machine's OCI architecture (amd64, arm64)."""
    m = platform.machine()
    return {v: k for k, v in MACHINES.items()}.get(m, m)
