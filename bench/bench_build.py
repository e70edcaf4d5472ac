#!/usr/bin/env python3
"""Build benchmark (not a timed test): cold build, no-op rebuild, rebuild after one pin
changes, and how much the shared layers save.

    # cold numbers need an empty engine, e.g. the clean-room one:
    eval "$(scripts/clean-engine.sh)"           # prints export DOCKER_HOST=...
    .venv/bin/python bench/bench_build.py --profile ci --network host
    scripts/clean-engine.sh stop --purge

Steps
  1. cold      build.py --matrix --profile P          (includes bootstrapping the base image)
  2. no-op     the same again                         (every immutable tag exists: nothing builds)
  3. one pin   in a scratch copy, change one pin (default: mpi4py in matrix.yaml's python
               packages), --lock, build again: which cells rebuilt, and per cell how many
               build steps ran vs came from the layer cache
  4. sizes     sum of the profile's image sizes vs the disk they really use (shared layers
               counted once, from `docker system df -v`)
Writes a Markdown table to stdout and JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbase_common import engine  # noqa: E402

PY = sys.executable
COPY = ("matrix.yaml", "templates", "imagefs", "locks", "patches", "images", ".dockerignore")


class _Done(Exception):
    pass


def build(cwd: Path, profile: str, report: Path, extra: list[str]) -> tuple[float, dict, str]:
    t0 = time.monotonic()
    r = subprocess.run(
        [
            PY,
            str(ROOT / "build.py"),
            "--matrix",
            "--file",
            str(cwd / "matrix.yaml"),
            "--profile",
            profile,
            "--report",
            str(report),
            "--log-dir",
            str(report.parent / "logs"),
            *extra,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - t0
    data = json.loads(report.read_text()) if report.exists() else {}
    return elapsed, data, r.stdout + r.stderr


def steps(log: str | None) -> tuple[int, int]:
    """(steps that ran, steps served from cache) in a BuildKit plain-progress log."""
    if not log or not Path(log).exists():
        return 0, 0
    text = Path(log).read_text(errors="replace")
    ids = set(re.findall(r"^#(\d+) \[[^\]]+\] (?:RUN|COPY)", text, re.M))
    cached = {i for i in ids if re.search(rf"^#{i} CACHED$", text, re.M)}
    return len(ids) - len(cached), len(cached)


def sizes(images: list[str]) -> tuple[int, int]:
    """(sum of the images' sizes, bytes their layers really take): every layer counted once,
    read from the engine's layer store (layerdb/<chain id>/size; needs a local engine, root)."""
    import hashlib

    facts = engine.info()
    layerdb = Path(facts.root_dir) / "image" / facts.driver / "layerdb" / "sha256"
    total, chains = 0, {}
    for ref in images:
        info = engine.inspect_image(ref).raw
        total += info["Size"]
        chain = None
        for diff in info["RootFS"]["Layers"]:
            chain = diff if chain is None else "sha256:" + hashlib.sha256(f"{chain} {diff}".encode()).hexdigest()
            size_file = layerdb / chain.split(":", 1)[1] / "size"
            chains[chain] = int(size_file.read_text()) if size_file.exists() else 0
    return total, sum(chains.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--network", help="passed to build.py (host, for the clean-room engine)")
    ap.add_argument(
        "--pin",
        default="python.packages:mpi4py==4.1.1:mpi4py==4.1.0",
        help="SECTION:OLD:NEW string replacement in matrix.yaml for step 3",
    )
    ap.add_argument("--skip-cold", action="store_true", help="start at step 2 (images already built)")
    ap.add_argument("--no-bump", action="store_true", help="skip step 3 (it rebuilds every cell above the pin)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "bench.json"))
    a = ap.parse_args()
    extra = ["--network", a.network] if a.network else []
    work = Path(tempfile.mkdtemp(prefix="trainbase-bench-"))
    res: dict = {"profile": a.profile, "docker_host": os.environ.get("DOCKER_HOST", "")}
    try:
        if not a.skip_cold:
            t, rep, out = build(ROOT, a.profile, work / "cold.json", extra)
            res["cold_s"] = round(t, 1)
            res["cold_cells"] = {c["name"]: c["status"] for c in rep.get("cells", [])}
            print(out[-2000:], file=sys.stderr)
        t, rep, out = build(ROOT, a.profile, work / "noop.json", extra)
        res["noop_s"] = round(t, 1)
        res["noop_statuses"] = sorted({c["status"] for c in rep.get("cells", [])})
        images = [c["image"] for c in rep.get("cells", [])]
        total, used = sizes(images)
        res["sizes"] = {"sum_of_images_bytes": total, "disk_used_bytes": used, "saved_by_sharing_bytes": total - used}

        if a.no_bump:
            res["bump"] = {"pin": "-", "seconds": "-", "cells": {}}
            raise _Done
        # step 3: one pin changes, in a scratch copy of the repository
        scratch = work / "repo"
        for name in COPY:
            src = ROOT / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, scratch / name)
        section, old, new = a.pin.split(":")
        text = (scratch / "matrix.yaml").read_text()
        if old not in text:
            raise SystemExit(f"--pin: {old!r} not in matrix.yaml")
        (scratch / "matrix.yaml").write_text(text.replace(old, new, 1))
        lock = subprocess.run(
            [PY, str(ROOT / "build.py"), "--lock", "--file", str(scratch / "matrix.yaml")],
            capture_output=True,
            text=True,
            check=False,
        )
        if lock.returncode != 0:
            raise SystemExit(f"--lock failed: {lock.stderr[-500:]}")
        t, rep, out = build(scratch, a.profile, work / "bump.json", extra)
        res["bump"] = {"pin": f"{old} -> {new}", "seconds": round(t, 1), "cells": {}}
        for c in rep.get("cells", []):
            ran, cached = steps(c.get("log"))
            res["bump"]["cells"][c["name"]] = {
                "status": c["status"],
                "steps_ran": ran,
                "steps_cached": cached,
                "duration_s": c["duration_s"],
            }
        for c in rep.get("cells", []):  # the bumped images are not kept
            engine.remove_image(c["image"])
    except _Done:
        pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"| profile | cold | no-op | after `{res['bump']['pin']}` | images (sum) | on disk | saved |")
    print("|---|---|---|---|---|---|---|")
    s = res["sizes"]
    print(
        f"| {a.profile} | {res.get('cold_s', '-')} s | {res['noop_s']} s | {res['bump']['seconds']} s | "
        f"{s['sum_of_images_bytes'] / 1e9:.2f} GB | {s['disk_used_bytes'] / 1e9:.2f} GB | "
        f"{s['saved_by_sharing_bytes'] / 1e9:.2f} GB |"
    )
    for n, c in res["bump"]["cells"].items():
        print(f"  {n}: {c['status']}, {c['steps_ran']} steps ran, {c['steps_cached']} cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
