"""Intra-node MPI speed of an image against the host's own MPI, measured in the same run.

Absolute times say nothing across machines; a ratio to a reference measured moments before on
the same cores does. The reference is the host's distro MPI with its distro mpi4py (on Debian
`openmpi-bin` + `python3-mpi4py`, installed by scripts/setup.sh) running the very probe the
image runs (trainbase_conformance/probes/pingpong_mpi4py.py). Host and image runs alternate and
each side keeps its best round, so a noisy neighbour cannot fail an image by itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

FLOOR_4MIB = 0.7  # the suite fails an image below this share of the host's 4 MiB bandwidth
GOAL_4MIB = 0.9  # what the images are built to reach (docs/performance.md)
GOAL_LATENCY = 1.3  # ... and at most this multiple of the host's 8 B latency


def parse(stdout: str) -> dict[str, Any]:
    """The probe's TBSPEED line."""
    for line in stdout.splitlines():
        if line.startswith("TBSPEED "):
            found: dict[str, Any] = json.loads(line.split(" ", 1)[1])
            return found
    raise ValueError(f"the probe printed no TBSPEED line: {stdout.strip()[-400:]}")


def host_command(probe: str, ranks: int = 2, reps: int = 5) -> list[str] | None:
    """The host's reference run, or None when the host has no MPI with mpi4py."""
    mpirun = shutil.which("mpirun")
    # the distro's Python first: its mpi4py is built against the distro MPI (a pyenv or venv
    # python3 earlier on PATH has none, or one for another MPI)
    pythons = [p for p in ("/usr/bin/python3", shutil.which("python3")) if p]
    python = next(
        (
            p
            for p in pythons
            if subprocess.run([p, "-c", "import mpi4py"], capture_output=True, check=False).returncode == 0
        ),
        None,
    )
    if not mpirun or not python:
        return None
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, check=False).stdout
    flags = ["--allow-run-as-root", "--oversubscribe"] if "Open MPI" in version or "OpenRTE" in version else []
    return [mpirun, *flags, "-np", str(ranks), python, probe, str(reps)]


def settle() -> None:
    """Wait for the write-back earlier work left in flight before timing anything: on a 2-core
    VM it takes the CPU for minutes (the runtime tier writes about 5 GB per image: an unpack for
    ch-run and a Podman store), and a speed check run during it saw host and image both at a
    quarter of their speed (host 3.7, image 2.4 GB/s instead of 11-27). Needs no privilege."""
    import os

    os.sync()


def host_reference(probe: str, reps: int = 5, timeout: int = 300) -> dict[str, Any]:
    cmd = host_command(probe, reps=reps)
    if cmd is None:
        raise FileNotFoundError(
            "the host has no mpirun with python3-mpi4py (Debian: apt-get install openmpi-bin "
            "python3-mpi4py; scripts/setup.sh does)"
        )
    # the host's environment, less any OMPI_/UCX_ setting a caller exported for the image
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "UCX_", "PMIX_", "I_MPI_", "FI_"))}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the host's reference run exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    return parse(p.stdout)


def loopback_bytes(proc_net_dev: str) -> int:
    """Bytes received by the loopback device, from a /proc/net/dev read inside a container.

    Every TCP or UDP packet between two processes of one network namespace crosses `lo`,
    whichever of the namespace's addresses they use, so the counter's growth over an
    intra-node MPI run is what that run sent through the network stack. Counting it is exact
    where a bandwidth ratio is noisy: a TCP fallback at 0.57x and a slow round of a good
    transport can look alike on a loaded 2-core machine, their bytes on `lo` never do."""
    for line in proc_net_dev.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == "lo":
            return int(counters.split()[0])
    raise ValueError("no loopback device in /proc/net/dev")


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the best of several runs: highest bandwidth, lowest latency and time."""
    out = dict(runs[0])
    for k in ("bw_64KiB_GBs", "bw_4MiB_GBs"):
        out[k] = max(r[k] for r in runs)
    for k in ("lat_8B_us", "allreduce_4MiB_ms"):
        out[k] = min(r[k] for r in runs)
    return out


@dataclass
class Ratios:
    lat_8B: float  # image / host (lower is better; 1.0 = as fast)
    bw_64KiB: float  # image / host (higher is better)
    bw_4MiB: float
    allreduce_4MiB: float  # host time / image time (higher is better)

    @classmethod
    def of(cls, image: dict[str, Any], host: dict[str, Any]) -> Ratios:
        return cls(
            lat_8B=round(image["lat_8B_us"] / host["lat_8B_us"], 2),
            bw_64KiB=round(image["bw_64KiB_GBs"] / host["bw_64KiB_GBs"], 2),
            bw_4MiB=round(image["bw_4MiB_GBs"] / host["bw_4MiB_GBs"], 2),
            allreduce_4MiB=round(host["allreduce_4MiB_ms"] / image["allreduce_4MiB_ms"], 2),
        )

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)
