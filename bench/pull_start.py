#!/usr/bin/env python3
"""Pull + start benchmark (not a timed test): one image pushed to a loopback
registry in each layer compression, then, from an empty store, the time to pull it and to run
the first `python -c 'import torch'` (or `import mpi4py` in an image without PyTorch), through
each client here that reads zstd layers, and lazily through containerd's stargz snapshotter.

    .venv/bin/python bench/pull_start.py --image trainbase/pytorch2.9.1-openmpi4.1.4-...:rTAG
    .venv/bin/python bench/pull_start.py --image IMG --variant gzip --variant zstd:3 --variant zstd:12 --rounds 2
    .venv/bin/python bench/pull_start.py --image IMG --variant gzip --variant zstd --variant estargz

Variant `estargz` is gzip-compatible eStargz written by `ctr-remote images optimize` (the files the
first import reads put first and marked for prefetch); every client pulls it as gzip, and client
`stargz` pulls it lazily (bench/lazy_pull.py).

Variants are COMPRESSION[:LEVEL], written by skopeo (`--format oci --dest-compress-format`),
each into a registry of its own: skopeo's blob-info cache would otherwise hand back a blob it
pushed earlier in another compression (../shared/notes/machine.md). Clients:
  ctr      containerd 1.6, the one under this machine's dockerd (`ctr images pull` into a fresh
           namespace, then `ctr run`); Docker 20.10 itself cannot pull zstd
  podman   rootless Podman 4.3 as the runtime tier's user, store reset before each pull
           (`podman pull`, then `podman run`)
  stargz   a private containerd 1.6 with the stargz snapshotter (`ctr-remote images rpull`, then
           `ctr run --snapshotter stargz`), its stores and chunk cache emptied before each pull;
           only for `estargz`
Each pull starts from an empty store after a `sync` (no earlier write-back in flight) and ends
when the import returns, as a user's job would; the page cache keeps the write-back of the pulled
bytes out of the figure for either compression alike. Markdown on stdout, JSON to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainbase_conformance import runtimes

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lazy_pull
from lazy_pull import run

CONTAINERD = "/var/run/docker/containerd/containerd.sock"
CLIENTS = ("ctr", "podman", "stargz")
ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


@contextlib.contextmanager
def registry():
    """Debian's docker-registry (distribution v2) on a free loopback port, plain HTTP, no auth."""
    exe = shutil.which("docker-registry")
    if not exe:
        raise SystemExit("docker-registry not installed (scripts/setup.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="tbpull-registry-", dir="/var/tmp") as d, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        Path(d, "config.yml").write_text(
            f"version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {d}/data}}}}\n"
            f"http: {{addr: '127.0.0.1:{port}'}}\n"
        )
        proc = subprocess.Popen([exe, "serve", f"{d}/config.yml"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                time.sleep(0.2)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def push(image: str, host: str, variant: str, ctd=None, command=(), platform: str = "") -> dict:
    """skopeo copy docker-daemon:IMAGE -> HOST/bench:VARIANT; the manifest's layers are checked
    to be in the asked compression (skopeo silently keeps gzip without --format oci). `estargz`:
    the gzip copy optimized for COMMAND by ctr-remote in the private containerd CTD."""
    fmt, _, level = variant.partition(":")
    ref = f"{host}/bench/image:{variant.replace(':', '-')}"
    t0 = time.monotonic()
    run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--format",
            "oci",
            "--dest-tls-verify=false",
            "--dest-compress-format",
            "gzip" if fmt == "estargz" else fmt,
            *(["--dest-compress-level", level] if level else []),
            f"docker-daemon:{image}",
            f"docker://{ref}{'-src' if fmt == 'estargz' else ''}",
        ]
    )
    if fmt == "estargz":
        lazy_pull.optimize(ctd, f"{ref}-src", ref, list(command), platform)
    seconds = time.monotonic() - t0
    manifest = json.loads(run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"]).stdout)
    types = {x["mediaType"] for x in manifest["layers"]}
    if (fmt == "zstd") != (types == {ZSTD}):
        raise RuntimeError(f"{variant}: the pushed layers are {sorted(types)}")
    toc = "containerd.io/snapshot/stargz/toc.digest"
    if (fmt == "estargz") != all(toc in (x.get("annotations") or {}) for x in manifest["layers"]):
        raise RuntimeError(f"{variant}: the pushed layers {'lack' if fmt == 'estargz' else 'carry'} eStargz TOCs")
    return {
        "ref": ref,
        "push_s": round(seconds, 1),
        "layers": len(manifest["layers"]),
        "bytes": sum(x["size"] for x in manifest["layers"]),
    }


def ctr_pull_start(ref: str, command: list[str], platform: str) -> tuple[float, float]:
    ns = f"tbpull-{uuid.uuid4().hex[:8]}"
    ctr = ["ctr", "--address", CONTAINERD, "--namespace", ns]
    try:
        subprocess.run(["sync"], check=True)
        t0 = time.monotonic()
        run([*ctr, "images", "pull", "--plain-http", "--platform", platform, ref])
        t1 = time.monotonic()
        run([*ctr, "run", "--rm", "--platform", platform, ref, f"tbpull-{uuid.uuid4().hex[:6]}", *command], timeout=600)
        return t1 - t0, time.monotonic() - t1
    finally:
        # --sync waits for containerd's garbage collection: the image's content and snapshots
        # go with it, and the namespace is empty enough to be removed
        subprocess.run([*ctr, "images", "rm", "--sync", ref], capture_output=True, check=False)
        gone = subprocess.run(
            ["ctr", "--address", CONTAINERD, "namespaces", "rm", ns], capture_output=True, text=True, check=False
        )
        if gone.returncode != 0:
            print(f"  warning: containerd namespace {ns} left behind: {gone.stderr.strip()}", file=sys.stderr)


def podman_pull_start(ref: str, command: list[str], platform: str) -> tuple[float, float]:
    """Rootless, as the runtime tier's user (Podman as root cannot start a container on this
    host: runc is refused the nofile/nproc limits Podman asks for)."""
    user = runtimes.podman_ready(runtimes.ensure_user().pw_name).pw_name
    reset = ["podman", "system", "reset", "--force"]
    try:
        runtimes.as_user(user, reset, timeout=600)
        subprocess.run(["sync"], check=True)
        t0 = time.monotonic()
        p = runtimes.as_user(
            user, ["podman", "pull", "--quiet", "--tls-verify=false", "--platform", platform, ref], timeout=1800
        )
        if p.returncode != 0:
            raise RuntimeError(f"podman pull exited {p.returncode}: {p.stderr.strip()[-600:]}")
        t1 = time.monotonic()
        p = runtimes.podman_run(user, ref, [], shlex.join(command), timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"podman run exited {p.returncode}: {p.stderr.strip()[-600:]}")
        return t1 - t0, time.monotonic() - t1
    finally:
        runtimes.as_user(user, reset, timeout=600)


def first_import(image: str) -> list[str]:
    r = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
        capture_output=True,
        text=True,
        check=True,
    )
    labels = json.loads(r.stdout) or {}
    module = (
        "torch"
        if any(k.startswith("io.trainbase.framework") and "pytorch" in v for k, v in labels.items())
        or "pytorch" in image
        else "mpi4py"
    )
    return ["python", "-c", f"import {module}"]


def platform_of(image: str) -> str:
    r = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", image],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip()


def reads(client: str, variant: str) -> bool:
    """Lazy pulling needs eStargz's tables of contents; every other client reads every variant
    (eStargz as the gzip it also is)."""
    return client != "stargz" or variant.startswith("estargz")


def markdown(rows: list[dict]) -> str:
    out = [
        "| image | variant | client | layers | layers GB | push s | pull s | start + import s | total s | total ÷ gzip |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    # each row against gzip through the same client; the lazy client, which cannot read plain
    # gzip lazily, against gzip through containerd's own pull (`ctr`), the same daemon's full pull
    base = {(r["image"], r["client"]): r["total_s"] for r in rows if r["variant"] == "gzip" and "total_s" in r}
    for image, client in list(base):
        if client == "ctr":
            base.setdefault((image, "stargz"), base[image, client])
    for r in rows:
        if "total_s" not in r:
            out.append(f"| {r['image']} | {r['variant']} | {r['client']} | | | | error: {r['error'][:80]} | | | |")
            continue
        key = (r["image"], r["client"])
        ratio = f"{r['total_s'] / base[key]:.2f}×" if key in base else "–"
        out.append(
            f"| {r['image']} | {r['variant']} | {r['client']} | {r['layers']} | {r['bytes'] / 1e9:.2f} | "
            f"{r['push_s']:.0f} | {r['pull_s']:.1f} | {r['start_s']:.1f} | {r['total_s']:.1f} | {ratio} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", required=True)
    ap.add_argument("--variant", action="append", help="COMPRESSION[:LEVEL]; default: gzip, zstd")
    ap.add_argument("--client", action="append", choices=CLIENTS, help="default: all")
    ap.add_argument("--rounds", type=int, default=1, help="pulls per variant and client; the best is kept")
    ap.add_argument("--out", default="reports/pull-start.json")
    a = ap.parse_args()
    rows = []
    variants = a.variant or ["gzip", "zstd"]
    lazy = any(v.startswith("estargz") for v in variants)
    with lazy_pull.private_containerd() if lazy else contextlib.nullcontext() as ctd:
        for image in a.image:
            rows += bench_image(
                image, variants, [c for c in a.client or CLIENTS if c != "stargz" or lazy], a.rounds, ctd
            )
    print(markdown(rows))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0 if all("total_s" in r for r in rows) else 1


def bench_image(image: str, variants: list[str], clients: list[str], rounds: int, ctd) -> list[dict]:
    rows = []
    command, platform = first_import(image), platform_of(image)
    for variant in variants:
        with registry() as host:
            pushed = push(image, host, variant, ctd, command, platform)
            print(
                f"  pushed {variant}: {pushed['bytes'] / 1e9:.2f} GB in {pushed['layers']} layers, "
                f"{pushed['push_s']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            for client in (c for c in clients if reads(c, variant)):
                row = {"image": image.rsplit("/", 1)[-1], "variant": variant, "client": client, **pushed}
                try:
                    pull_start = {
                        "ctr": ctr_pull_start,
                        "podman": podman_pull_start,
                        "stargz": functools.partial(lazy_pull.lazy_pull_start, ctd),
                    }[client]
                    best = min((pull_start(pushed["ref"], command, platform) for _ in range(rounds)), key=sum)
                    row |= {"pull_s": round(best[0], 1), "start_s": round(best[1], 1), "total_s": round(sum(best), 1)}
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    row["error"] = str(e)
                rows.append(row)
                print(
                    f"  {variant:<10} {client:<7} "
                    + (
                        f"pull {row['pull_s']} s + start {row['start_s']} s"
                        if "total_s" in row
                        else f"ERROR {row['error']}"
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    sys.exit(main())
