"""What this host really offers containers: GPUs only when the engine can hand them over,
RDMA devices only when /dev/infiniband has nodes; said in every report."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainbase_common import engine


@dataclass
class HostCaps:
    """What containers on this host can be given, and why (said in every report)."""

    gpu: bool
    gpu_why: str
    ib_devices: list[str]
    ib_why: str
    shm_size: str = "1g"
    init: bool = True
    # what the host's `nvidia-smi -L` lists: a container must see every one of them (a
    # container handed 1 of 8 GPUs would otherwise pass the GPU tier with no bus traffic)
    gpu_count: int = 0
    # the GPUs by model and compute capability ("8 x NVIDIA H100 80GB HBM3 (9.0)"): the record of
    # what a GPU tier ran on (the catalogue's "tested on" column reads it from the JUnit report)
    gpu_models: str = ""

    @property
    def ib(self) -> bool:
        return bool(self.ib_devices)

    def run_options(self) -> engine.RunOptions:
        # --init reaps orphaned sshd/orted children of docker exec. With RDMA devices or GPUs:
        # IPC_LOCK, for registered (pinned) memory -- verbs memory regions, and the pinned host
        # buffers NCCL and CUDA allocate; a higher memlock ulimit would help too but needs
        # CAP_SYS_RESOURCE in the engine, which not every host grants. Every GPU (--gpus all).
        return engine.RunOptions(
            shm_size=self.shm_size,
            init=self.init,
            gpus=self.gpu,
            devices=tuple(self.ib_devices),
            cap_add=("IPC_LOCK",) if self.ib or self.gpu else (),
        )

    def describe(self) -> dict[str, str]:
        return {
            "gpu": ("yes" if self.gpu else "no") + f" ({self.gpu_why})",
            "ib": ("yes" if self.ib else "no") + f" ({self.ib_why})",
            "run_flags": self.run_options().describe(),
            **({"gpus": self.gpu_models} if self.gpu_models else {}),
        }


def gpu_models(smi: str) -> str:
    """``nvidia-smi --query-gpu=name,compute_cap``, counted by model: "8 x NVIDIA H100 80GB HBM3
    (9.0)"; "" where the query fails (a driver too old for compute_cap)."""
    try:
        p = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if p.returncode != 0:
        return ""
    return describe_gpus(p.stdout)


def describe_gpus(csv: str) -> str:
    counts: dict[str, int] = {}
    for line in csv.splitlines():
        name, _, cc = line.rpartition(",")
        if name.strip() and cc.strip():
            key = f"{name.strip()} ({cc.strip()})"
            counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{n} x {model}" for model, n in counts.items())


def probe_host(shm_size: str = "1g") -> HostCaps:
    """GPUs count only when ``nvidia-smi -L`` lists one AND the engine can hand them to a
    container (an ``nvidia`` runtime or the nvidia-container-cli hook); RDMA counts when
    /dev/infiniband has device nodes."""
    gpu, gpu_why, gpu_count, models = False, "", 0, ""
    smi = shutil.which("nvidia-smi")
    if not smi:
        gpu_why = "nvidia-smi not found"
    else:
        try:
            p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
            gpus = [ln for ln in p.stdout.splitlines() if ln.startswith("GPU ")]
            if p.returncode != 0 or not gpus:
                gpu_why = f"nvidia-smi -L exited {p.returncode}: {(p.stderr or p.stdout).strip()[:120]}"
            else:
                if "nvidia" in engine.info().runtimes or shutil.which("nvidia-container-cli"):
                    gpu, gpu_why = True, f"{len(gpus)} GPU(s): " + "; ".join(g.split(" (")[0] for g in gpus)
                    gpu_count = len(gpus)
                    models = gpu_models(smi)
                else:
                    gpu_why = f"{len(gpus)} GPU(s) but no NVIDIA container runtime in the engine"
        except (OSError, subprocess.TimeoutExpired) as e:
            gpu_why = f"nvidia-smi failed: {e}"
    ib_dir = Path("/dev/infiniband")
    devices = sorted(str(p) for p in ib_dir.iterdir()) if ib_dir.is_dir() else []
    ib_why = (
        f"{len(devices)} device node(s) in /dev/infiniband"
        if devices
        else "/dev/infiniband absent"
        if not ib_dir.exists()
        else "/dev/infiniband is empty"
    )
    init = Path("/usr/bin/docker-init").exists() or Path("/usr/libexec/docker/docker-init").exists()
    return HostCaps(
        gpu=gpu,
        gpu_why=gpu_why,
        ib_devices=devices,
        ib_why=ib_why,
        shm_size=shm_size,
        init=init,
        gpu_count=gpu_count,
        gpu_models=models,
    )
