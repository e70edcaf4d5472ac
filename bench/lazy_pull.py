"""Lazy pulling for the pull + start bench (bench/pull_start.py, variant `estargz`, client
`stargz`).

An eStargz layer is an ordinary gzip tar -- every engine pulls it as gzip, Docker 20.10 included --
whose files are gzip members of their own, with a table of contents at the end. containerd's
stargz snapshotter mounts such a layer over FUSE instead of unpacking it, fetches a file's chunks
with HTTP range requests when the file is first read, and prefetches in the background the files
`ctr-remote images optimize` found the workload reading (it runs the image once under fanotify and
puts those files first in each layer, behind a landmark). A pull is then the manifest and the
tables of contents; the first `import torch` reads what it needs and nothing else is written.

This module runs that client here: Debian 12's containerd 1.6 (the binary under dockerd) as a
private instance -- its own root, state and socket, so resetting it never touches Docker's --
with the snapshotter (bench/stargz/main.go, built here with Debian's Go against Debian's
stargz-snapshotter library) as its proxy plugin, and Debian's `ctr-remote` to convert, push and
lazily pull (`rpull`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# Debian 12 packages the client needs: the Go toolchain and the snapshotter's library to build
# the daemon, ctr-remote (optimize / push / rpull). Installed on first use: only this bench needs them.
PACKAGES = ("golang-go", "golang-github-containerd-stargz-snapshotter-dev", "stargz-snapshotter")
SOURCE = Path(__file__).resolve().with_name("stargz") / "main.go"
CACHE = Path("/var/cache/trainbase/bench")
# how long `optimize` watches the workload's file accesses: `import torch` under arm64
# emulation takes ~20 s here, natively ~3 s
MONITOR_S = 90


def run(argv: list[str], timeout: int = 1800, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:5])}... exited {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}")
    return p


def ensure_tools() -> Path:
    """Install what is missing, build the snapshotter daemon once per source revision; its path."""
    missing = [
        p for p in PACKAGES if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode != 0
    ]
    if missing:
        run(
            ["apt-get", "install", "-y", "--no-install-recommends", *missing],
            timeout=900,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    exe = CACHE / f"containerd-stargz-grpc-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]}"
    if not exe.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="tbstargz-") as d:
            shutil.copy(SOURCE, d)
            # GOPATH mode against /usr/share/gocode: Debian's -dev packages are the dependencies,
            # nothing is downloaded (there is no module proxy to reach here)
            run(
                ["go", "build", "-o", str(exe), "."],
                cwd=d,
                timeout=900,
                env={
                    **os.environ,
                    "GO111MODULE": "off",
                    "GOPATH": "/usr/share/gocode",
                    "GOCACHE": str(CACHE / "go-build"),
                    "GOFLAGS": "",
                },
            )
    return exe


class PrivateContainerd:
    """containerd of its own with the stargz snapshotter as a proxy plugin; reset() empties its
    content store, its snapshots and the snapshotter's chunk cache (the bench's "empty store")."""

    def __init__(self, snapshotter_exe: Path, workdir: Path):
        self.exe, self.dir = snapshotter_exe, workdir
        self.sock, self.stargz_sock = workdir / "containerd.sock", workdir / "stargz.sock"
        self.procs: list[subprocess.Popen] = []

    def ctr(self, *args: str, remote: bool = False) -> list[str]:
        return ["ctr-remote" if remote else "ctr", "--address", str(self.sock), *args]

    def start(self) -> None:
        (self.dir / "config.toml").write_text(
            f'version = 2\nroot = "{self.dir}/root"\nstate = "{self.dir}/state"\n'
            # the CRI plugin would want a CNI setup and is not what the bench measures
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.sock}"\n'
            f'[proxy_plugins.stargz]\n  type = "snapshot"\n  address = "{self.stargz_sock}"\n'
        )
        logs = self.dir / "logs"
        logs.mkdir(exist_ok=True)
        for argv, log in (
            ([str(self.exe), "-address", str(self.stargz_sock), "-root", str(self.dir / "stargz")], "stargz.log"),
            (["containerd", "--config", str(self.dir / "config.toml")], "containerd.log"),
        ):
            with open(logs / log, "ab") as out:
                self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
        for _ in range(150):
            if subprocess.run(self.ctr("plugins", "ls"), capture_output=True, text=True, check=False).stdout.count(
                "stargz"
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"private containerd did not come up: see {logs}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
            if p.poll() is None:
                p.kill()
        self.procs = []
        # the snapshotter's FUSE mounts and the snapshots' overlays outlive a killed daemon
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(self.dir))
        ]
        for m in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)

    def reset(self) -> None:
        self.stop()
        for sub in ("root", "state", "stargz"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        self.start()
        subprocess.run(["sync"], check=True)


@contextlib.contextmanager
def private_containerd():
    exe = ensure_tools()
    with tempfile.TemporaryDirectory(prefix="tbctd-", dir="/var/tmp") as d:
        ctd = PrivateContainerd(exe, Path(d))
        ctd.start()
        try:
            yield ctd
        finally:
            ctd.stop()


def optimize(ctd: PrivateContainerd, src: str, dst: str, command: list[str], platform: str) -> None:
    """SRC (gzip, in a loopback registry) -> DST: eStargz layers with the files COMMAND reads
    first, prefetched on a lazy pull. `optimize` runs the image once to record them."""
    run(ctd.ctr("images", "pull", "--plain-http", "--platform", platform, src))
    # gzip's default level 6, as skopeo writes the gzip variant (ctr-remote's own default is 9)
    run(
        ctd.ctr(
            "images",
            "optimize",
            "--oci",
            "--platform",
            platform,
            "--period",
            str(MONITOR_S),
            "--estargz-compression-level",
            "6",
            "--entrypoint",
            json.dumps(command[:1]),
            "--args",
            json.dumps(command[1:]),
            src,
            dst,
            remote=True,
        ),
        timeout=3600,
        env={**os.environ, "TMPDIR": str(ctd.dir)},
    )  # it spools whole uncompressed layers: into the
    # private store, removed with it (a 7.75 GB image needs ~30 GB free for the whole bench)
    run(ctd.ctr("images", "push", "--plain-http", "--platform", platform, dst, remote=True))


def lazy_pull_start(ctd: PrivateContainerd, ref: str, command: list[str], platform: str) -> tuple[float, float]:
    """From an empty store: `rpull` (manifest, config, each layer's table of contents, mounted
    over FUSE), then the first import in a container on the stargz snapshotter."""
    ctd.reset()
    t0 = time.monotonic()
    run(ctd.ctr("images", "rpull", "--plain-http", ref, remote=True))
    t1 = time.monotonic()
    run(
        ctd.ctr(
            "run", "--rm", "--snapshotter", "stargz", "--platform", platform, ref, f"tblazy-{os.getpid()}", *command
        ),
        timeout=900,
    )
    return t1 - t0, time.monotonic() - t1
