#!/usr/bin/env python3
"""MPI speed benchmark (not a timed test): each image, run the ways it is run here, against the
host's own MPI measured in the same run; printed as ratios.

    .venv/bin/python bench/mpi_speed.py --report reports/build.json          # every built image
    .venv/bin/python bench/mpi_speed.py --image trainbase/openmpi4.1.4-...:rTAG --rounds 3

The probe is trainbase_conformance/probes/pingpong_mpi4py.py (mpi4py, standard library only): ping-
pong latency at 8 B, bandwidth at 64 KiB and 4 MiB between two ranks, a 4 MiB float64 Allreduce.
OSU micro-benchmarks and IMB are not reachable from a machine with only PyPI and Debian's mirror (their tarballs live on
mvapich.cse.ohio-state.edu and GitHub, and no package registry here ships them), so the probe
is mpi4py, as docs/performance.md says. The host reference is Debian's `openmpi-bin` with
`python3-mpi4py` (scripts/setup.sh installs them), run as root with the same probe.

Runtimes measured, two ranks each:
  docker          Docker's default profile, no extra capability (how users run the images)
  docker-uid      the same as a uid with no passwd entry (--user 4242:4242, HOME=/tmp)
  docker-ptrace   --cap-add SYS_PTRACE (cross-memory attach allowed: the upper bound)
  two-containers  one rank in each of two containers on a private network (mpirun over ssh)
  podman          rootless Podman as an unprivileged host user (trainbase_conformance/runtimes.py)
  ch-run          Charliecloud's ch-run --set-env as that user, mpirun inside one container
  srun-ch-run-join, srun-ch-run
                  a one-node Slurm (trainbase_conformance/slurm.py): srun -n 2 --mpi=pmix ch-run with and
                  without --join; without it each rank has its own user namespace and
                  cross-memory attach is refused (the path the images must stay fast without)
Each runtime alternates with a host run; each side keeps its best of --rounds runs.
Writes Markdown to stdout and JSON to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbase_common import buildkit, engine  # noqa: E402
from trainbase_common.manifest import MANIFEST_PATH  # noqa: E402
from trainbase_common.states import usable_images  # noqa: E402
from trainbase_conformance import runtimes, slurm, speed  # noqa: E402
from trainbase_conformance.containers import ssh_cluster  # noqa: E402
from trainbase_conformance.flavors import MpiFlavor  # noqa: E402

PROBE = ROOT / "trainbase_conformance" / "probes" / "pingpong_mpi4py.py"
RUNTIMES = (
    "docker",
    "docker-uid",
    "docker-ptrace",
    "two-containers",
    "podman",
    "ch-run",
    "srun-ch-run-join",
    "srun-ch-run",
)
HPC_RUNTIMES = RUNTIMES[4:]


def manifest(docker: str, image: str) -> dict:
    r = subprocess.run(
        [docker, "run", "--rm", "--entrypoint", "cat", image, MANIFEST_PATH], capture_output=True, text=True, check=True
    )
    return json.loads(r.stdout)


def in_docker(docker: str, image: str, mpi: MpiFlavor, python: str, flags: list[str], env: dict[str, str]) -> dict:
    launch = mpi.local(2)
    cmd = [
        docker,
        "run",
        "--rm",
        "--shm-size=1g",
        *flags,
        *[a for k, v in env.items() for a in ("-e", f"{k}={v}")],
        "-v",
        f"{PROBE}:/tmp/pingpong.py:ro",
        "-e",
        "HOME=/tmp",
        image,
        "bash",
        "-c",
        f"{launch} {python} /tmp/pingpong.py 5",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"exited {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")
    return speed.parse(p.stdout)


def across_two(image: str, mpi: MpiFlavor, python: str, env: dict[str, str]) -> dict:
    opts = engine.RunOptions(shm_size="1g")
    with ssh_cluster(image, lambda _h: opts, prepare=lambda c: c.put(PROBE, "/tmp")) as (nodes, _net):  # noqa: S108 -- the container's /tmp
        r = nodes[0].exec(
            f"{mpi.across([n.hostname for n in nodes], 1)} {python} /tmp/pingpong_mpi4py.py 3 0.05",
            timeout=600,
            env=env or None,
        )
        if r.returncode != 0:
            raise RuntimeError(f"exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
        return speed.parse(r.stdout)


class HpcSide(contextlib.ExitStack):
    """What the Podman, Charliecloud and Slurm rows need, set up once on first use and torn
    down at the end: the runtime tier's unprivileged user, the probe where that user can read
    it, each image unpacked for ch-run / loaded into Podman, a one-node Slurm."""

    def __init__(self) -> None:
        super().__init__()
        self.user = ""
        self.probes = ""
        self.cluster: slurm.Slurm | None = None
        self.dirs: dict[str, Path] = {}
        self.podman: dict[str, str] = {}

    def ready(self) -> str:
        if not self.user:
            self.user = runtimes.ensure_user().pw_name
            self.probes = self.enter_context(tempfile.TemporaryDirectory(prefix="tbbench-"))
            shutil.copy(PROBE, self.probes)
            Path(self.probes).chmod(0o755)
            Path(self.probes, PROBE.name).chmod(0o644)
        return self.user

    # Both set-ups write gigabytes; os.sync() waits for the write-back that would otherwise run
    # during the first measurement (seen: ch-run at 0.21x and the next host reference at a
    # quarter of its speed, both back to 1x once the page cache was flushed first).
    def unpacked(self, image: str) -> Path:
        if image not in self.dirs:
            self.dirs[image] = runtimes.unpack(image)
            self.callback(runtimes.remove_unpacked, self.dirs[image])
            os.sync()
        return self.dirs[image]

    def podman_ref(self, image: str) -> str:
        if image not in self.podman:
            self.podman[image] = runtimes.podman_load(self.ready(), image)
            self.callback(runtimes.podman_remove, self.user, self.podman[image])
            os.sync()
        return self.podman[image]

    def slurm(self) -> slurm.Slurm:
        if self.cluster is None:
            if missing := slurm.missing():
                raise RuntimeError(f"no Slurm here: {', '.join(missing)} missing (scripts/setup.sh installs it)")
            root = Path(self.enter_context(tempfile.TemporaryDirectory(prefix="tbbench-slurm-")))
            self.cluster = slurm.start(root)
            self.callback(self.cluster.stop)
        return self.cluster

    def run(self, rt: str, image: str, mpi: MpiFlavor, env: dict[str, str]) -> dict:
        """One round of the probe under ``rt``; ``env`` set in the container (after the image's
        ENV, as `docker run -e` would)."""
        user = self.ready()
        probe = f"/mnt/{PROBE.name} 5"
        set_env = ["--set-env", *[f"--set-env={k}={v}" for k, v in env.items()]]
        if rt == "podman":
            p = runtimes.podman_run(
                user,
                self.podman_ref(image),
                ["-v", f"{self.probes}:/mnt:ro", *[f"-e={k}={v}" for k, v in env.items()]],
                f"cd /tmp && {mpi.local(2)} python3 {probe}",
                timeout=600,
            )
        elif rt == "ch-run":
            p = runtimes.as_user(
                user,
                [
                    "ch-run",
                    *set_env,
                    "-b",
                    f"{self.probes}:/mnt",
                    str(self.unpacked(image)),
                    "--",
                    "sh",
                    "-c",
                    f"cd /tmp && {mpi.local(2)} python3 {probe}",
                ],
                timeout=600,
            )
        else:
            join = ["--join"] if rt == "srun-ch-run-join" else []
            p = self.slurm().srun(
                [
                    "-n",
                    "2",
                    "--mpi=pmix",
                    "ch-run",
                    *join,
                    *set_env,
                    "-b",
                    f"{self.probes}:/mnt",
                    str(self.unpacked(image)),
                    "--",
                    "python3",
                    *probe.split(),
                ],
                user=user,
                timeout=600,
            )
        if p.returncode != 0:
            raise RuntimeError(f"exited {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")
        return speed.parse(p.stdout)


def measure(
    image: str, runtimes_: tuple[str, ...], rounds: int, hpc: HpcSide, env: dict[str, str] | None = None
) -> list[dict]:
    env = env or {}
    docker = buildkit.build_cli()
    man = manifest(docker, image)
    mpi = MpiFlavor.from_manifest(man)
    python = f"{man['components']['python']['prefix']}/bin/python"
    rows = []
    for rt in runtimes_:
        hosts, imgs, error = [], [], None
        t0 = time.monotonic()
        for _ in range(rounds):
            hosts.append(speed.host_reference(str(PROBE)))
            try:
                if rt == "two-containers":
                    imgs.append(across_two(image, mpi, python, env))
                elif rt in HPC_RUNTIMES:
                    imgs.append(hpc.run(rt, image, mpi, env))
                else:
                    flags = {
                        "docker": [],
                        "docker-uid": ["--user", "4242:4242"],
                        "docker-ptrace": ["--cap-add", "SYS_PTRACE"],
                    }[rt]
                    imgs.append(in_docker(docker, image, mpi, python, flags, env))
            except (RuntimeError, subprocess.TimeoutExpired, AssertionError, runtimes.RuntimeUnavailable) as e:
                error = str(e)
                break
        host = speed.best(hosts)
        row = {
            "image": image.rsplit("/", 1)[-1] + "".join(f" {k}={v}" for k, v in env.items()),
            "runtime": rt,
            "host": host,
            "seconds": round(time.monotonic() - t0),
        }
        if imgs and not error:
            best = speed.best(imgs)
            row |= {"result": best, "ratios": speed.Ratios.of(best, host).as_dict()}
        else:
            row["error"] = error
        rows.append(row)
        print(
            f"  {row['image'][:60]:<60} {rt:<16} "
            + (json.dumps(row.get("ratios")) if "ratios" in row else f"ERROR {error}"),
            file=sys.stderr,
            flush=True,
        )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| image | runtime | 8 B latency µs (× host) | 64 KiB GB/s (× host) | 4 MiB GB/s (× host) | "
        "allreduce 4 MiB ms (host ÷ image) | host 4 MiB GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "ratios" not in r:
            out.append(f"| {r['image']} | {r['runtime']} | error: {r['error'][:80]} | | | | |")
            continue
        x, q, h = r["result"], r["ratios"], r["host"]
        out.append(
            f"| {r['image']} | {r['runtime']} | {x['lat_8B_us']:.2f} ({q['lat_8B']:.2f}×) | "
            f"{x['bw_64KiB_GBs']:.2f} ({q['bw_64KiB']:.2f}×) | {x['bw_4MiB_GBs']:.2f} ({q['bw_4MiB']:.2f}×) | "
            f"{x['allreduce_4MiB_ms']:.2f} ({q['allreduce_4MiB']:.2f}×) | {h['bw_4MiB_GBs']:.2f} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", default=[])
    ap.add_argument("--report", help="every usable image of this build report")
    ap.add_argument("--runtime", action="append", choices=RUNTIMES, help="default: all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--setenv",
        action="append",
        default=[],
        metavar="K=V",
        help="run the image with this variable set (e.g. the transport setting of an older image)",
    )
    ap.add_argument("--out", default="reports/mpi-speed.json")
    a = ap.parse_args()
    images = a.image + (usable_images(a.report) if a.report else [])
    if not images:
        ap.error("give --image or --report")
    rows = []
    with HpcSide() as hpc:
        for img in images:
            rows += measure(img, tuple(a.runtime or RUNTIMES), a.rounds, hpc, dict(kv.split("=", 1) for kv in a.setenv))
    print(markdown(rows))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rounds": a.rounds, "rows": rows}, indent=2) + "\n")
    slow = [
        r
        for r in rows
        if r.get("ratios") and r["runtime"] != "two-containers" and r["ratios"]["bw_4MiB"] < speed.GOAL_4MIB
    ]
    print(f"\n{len(rows)} measurement(s); {len(slow)} intra-node below {speed.GOAL_4MIB}× the host's 4 MiB bandwidth")
    return 0


if __name__ == "__main__":
    sys.exit(main())
