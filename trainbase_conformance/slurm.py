"""A real one-node Slurm on loopback for the runtime tier: munged, slurmctld and slurmd from the
host's packages (Debian 12: `munge`, `slurmctld`, `slurmd`, `slurm-client`, and `libpmix-dev`
for `srun --mpi=pmix`, installed by scripts/setup.sh), each started with its own conf, state,
spool, socket and log files under one folder, and stopped by its PID afterwards. Nothing of the
host's own Slurm or munge (if it has one) is read or touched: every command here gets
SLURM_CONF pointing at the private conf.

Why a real one: what Slurm's `srun` gives each task (SLURM_*, PMI_RANK/PMI_SIZE without
MPI_LOCALRANKID under `--mpi=pmi2`, PMIX_* under `--mpi=pmix`) and which PMI server it runs
decide whether the image's MPI sees the world; hand-set variables prove neither."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainbase_conformance import runtimes

DAEMONS = ("munged", "slurmctld", "slurmd")
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib64/slurm")


class SlurmUnavailable(RuntimeError):
    """The host has no Slurm or munge to start (the message names the packages)."""


def missing() -> list[str]:
    """The host programs a one-node Slurm needs and does not find."""
    return [
        p
        for p in (*DAEMONS, "srun", "sinfo")
        if not shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    ]


def pmi_in_common(kind: str, speaks: set[str], offered: list[str]) -> tuple[list[str], str]:
    """The `srun --mpi=` plugins both the image's MPI (``kind``, which ``speaks`` those) and this
    Slurm (``offered``: `srun --mpi=list`) know, sorted; with none, the reason, naming what each
    side speaks. A check that loops over them must not pass having run nothing: without an
    overlap it is skipped with that reason."""
    common = sorted(set(speaks) & set(offered))
    if common:
        return common, ""
    return [], (
        f"no PMI in common: the image's {kind} speaks {', '.join(sorted(speaks)) or 'none this suite knows'}, "
        f"this Slurm offers {', '.join(offered) or 'nothing'} (srun --mpi=list)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _which(prog: str) -> str:
    found = shutil.which(prog, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if not found:
        raise SlurmUnavailable(
            f"{prog} not found (Debian: apt-get install munge slurmctld slurmd slurm-client "
            "libpmix-dev; scripts/setup.sh does)"
        )
    return found


@dataclass
class Slurm:
    """A running one-node cluster: ``env`` is what a client command (srun, sinfo) needs."""

    root: Path
    node: str
    cpus: int
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def mpi_plugins(self) -> list[str]:
        """What `srun --mpi=list` offers (none, pmi2, pmix...)."""
        p = subprocess.run(
            [_which("srun"), "--mpi=list"],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            timeout=60,
            check=False,
        )
        text = p.stdout + p.stderr
        return sorted(
            {
                w.strip(" ,:")
                for line in text.splitlines()
                for w in line.split()
                if w.strip(" ,:") in ("none", "pmi2", "pmix", "cray_shasta")
            }
            | {w.split("_")[0] for w in text.split() if w.startswith("pmix_v")}
        )

    def srun(
        self, args: list[str], *, user: str | None = None, timeout: int = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`srun ARGS` as ``user`` (root when None), bounded by ``timeout`` (Slurm's own --time
        too, so a hung step is cancelled by slurmctld, not just abandoned)."""
        cmd = [_which("srun"), f"--time={max(1, timeout // 60 + 1)}", *args]
        if user:
            # a login's environment plus ``env`` and SLURM_CONF, nothing of root's: srun hands
            # its environment to the tasks, as it does for the user's own jobs
            return runtimes.as_user(user, cmd, env={**(env or {}), **self.env}, timeout=timeout + 30)
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {}), **self.env},
            timeout=timeout + 30,
            check=False,
        )

    def logs(self, tail: int = 40) -> str:
        out = []
        for name in DAEMONS:
            f = self.root / f"{name}.log"
            if f.exists():
                out.append(f"--- {name}.log\n" + "\n".join(f.read_text(errors="replace").splitlines()[-tail:]))
        return "\n".join(out)

    def stop(self) -> None:
        """Stop every daemon started here by its PID (TERM, then KILL after 10 s)."""
        for name in reversed(DAEMONS):
            pid = self.pids.pop(name, None)
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.time() + 10
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _conf(root: Path, node: str, cpus: int, memory_mb: int, munge_socket: Path) -> str:
    ctld, slurmd = _free_port(), _free_port()
    return f"""# written by trainbase's conformance suite (trainbase_conformance/slurm.py): a one-node cluster on loopback
ClusterName=tbconf
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups in a container or a VM without them: track processes by /proc, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=tbconf Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def start(root: Path, timeout: float = 60) -> Slurm:
    """Start munged, slurmctld and slurmd under ``root`` and wait until the node is idle.
    Raises SlurmUnavailable (packages missing) or RuntimeError (a daemon did not come up, with
    its log)."""
    munged, slurmctld, slurmd = (_which(d) for d in DAEMONS)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # noqa: S103 -- task users read slurm.conf (a mkdtemp folder is 0700)
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o700)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    memory_mb = max(256, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = root / "munge" / "munge.socket"
    root.joinpath("slurm.conf").write_text(_conf(root, node, cpus, memory_mb, munge_socket))
    s = Slurm(root=root, node=node, cpus=cpus)
    env = {**os.environ, **s.env}
    try:
        # --force: munged refuses key and socket folders it did not vet (a temp dir's parents)
        subprocess.run(
            [
                munged,
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munge/munged.seed",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        s.pids["munged"] = int((root / "munged.pid").read_text())
        os.chmod(root / "munge", 0o755)  # noqa: S103 -- task users reach the socket (srun authenticates through it)
        for name, prog in (("slurmctld", slurmctld), ("slurmd", slurmd)):
            subprocess.run([prog, "-f", str(s.conf)], check=True, capture_output=True, text=True, timeout=60, env=env)
            pidfile = root / f"{name}.pid"
            deadline = time.time() + 20
            while not pidfile.exists() or not pidfile.read_text().strip():
                if time.time() > deadline:
                    raise RuntimeError(f"{name} wrote no PID file")
                time.sleep(0.2)
            s.pids[name] = int(pidfile.read_text())
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            p = subprocess.run(
                [_which("sinfo"), "-h", "-N", "-o", "%T"],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
                check=False,
            )
            state = p.stdout.strip() or p.stderr.strip()
            if state in ("idle", "mixed", "allocated"):
                return s
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node is {state!r} after {timeout:.0f} s")
    except (subprocess.CalledProcessError, RuntimeError, ValueError, OSError) as e:
        detail = getattr(e, "stderr", "") or ""
        logs = s.logs()
        s.stop()
        raise RuntimeError(f"starting Slurm under {root} failed: {e} {detail.strip()}\n{logs}") from None
