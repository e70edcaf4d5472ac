#!/usr/bin/env python3
"""Build stress check (not a timed test): do the checks in the rendered RUN lines fail by chance?

Issue 27: `ldconfig -p | grep -q 'libnccl.so.2 '` under the Dockerfiles' `SHELL [... "-o",
"pipefail" ...]` failed a fresh build with exit 141 (SIGPIPE) on some runs and not others.
A race like that shows up only when the check runs many times under load, so this script:

  1. renders every cell (of the working tree, or of a git revision with --rev) and parses each
     RUN line with the same shell parser as trainbase/render/pipefail_lint.py;
  2. keeps the pipelines that only read (ldconfig -p, grep, sed, dpkg-query, ...: commands in
     READ_ONLY below), so running them changes nothing;
  3. runs each one --runs times under `bash -o pipefail` inside a container of --image, while
     --load busy loops keep every core of the host busy, and counts the runs that did not exit
     as the same pipeline does on an idle machine (a check that fails even then does not apply
     to that image and is reported as such, not counted).

    .venv/bin/python bench/pipefail_stress.py --image trainbase/openmpi5.0.11-...:rTAG --rev e820e51
    .venv/bin/python bench/pipefail_stress.py --image trainbase/openmpi5.0.11-...:rTAG

Prints a Markdown table (pipeline, its block and cells, runs, failures, exit codes) and writes
JSON to --out. Exit 1 when any pipeline failed by chance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainbase.define.matrix import load  # noqa: E402
from trainbase.render import pipefail_lint as pl  # noqa: E402
from trainbase.render import recipes  # noqa: E402
from trainbase_common import buildkit  # noqa: E402

# Commands a pipeline may consist of to be run here: they read and print, nothing else.
READ_ONLY = {
    "ldconfig",
    "grep",
    "egrep",
    "fgrep",
    "sed",
    "awk",
    "head",
    "tail",
    "sort",
    "uniq",
    "cut",
    "tr",
    "wc",
    "cat",
    "echo",
    "printf",
    "ls",
    "find",
    "dpkg-query",
    "dpkg",
    "ompi_info",
    "ucx_info",
    "fi_info",
    "mpirun",
    "pip",
    "python",
    "python3",
    "readlink",
    "dirname",
    "basename",
    "nproc",
}
WRITES = ("-i", "--in-place", "-delete", "-exec", "install", "uninstall", "-w")


def checked_out(rev: str | None) -> Path:
    """The repository as of REV (a fresh `git archive` in a temporary folder), or the tree."""
    if not rev:
        return ROOT
    d = Path(tempfile.mkdtemp(prefix="pipefail-stress-"))
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(tar)) as t:
        t.extractall(d, filter="data")
    return d


def pipelines(root: Path) -> dict[str, dict]:
    """Every read-only pipeline of every rendered RUN line: text -> {block, cells, flagged}."""
    import io

    from dockerfile_parse import DockerfileParser

    m = load(root / "matrix.yaml")
    out: dict[str, dict] = {}
    for r in recipes.render_all(m, root=root).values():
        text = r.files[r.dockerfile]
        lines = text.splitlines()
        for ins in DockerfileParser(fileobj=io.BytesIO(text.encode())).structure:
            if ins["instruction"] != "RUN" or ins["value"].lstrip().startswith("["):
                continue
            block = next(
                (mm.group(1) for ln in reversed(lines[: ins["startline"]]) if (mm := pl._BLOCK.match(ln))), "-"
            )
            script = pl._RUN_FLAGS.sub("", ins["value"], count=1)
            data = script.encode()
            for node in _pipes(pl._parse(script)):
                if not all(_read_only(st) for st in _stages(node)):
                    continue
                src = " ".join(data[node["Pos"]["Offset"] : node["End"]["Offset"]].decode().split())
                e = out.setdefault(src, {"block": block, "cells": set(), "flagged": bool(pl.check_shell(src, "x"))})
                e["cells"].add(r.cell.name)
    return out


def _pipes(node):
    """The outermost `|` pipelines of a parsed script."""
    if isinstance(node, dict):
        if node.get("Type") == "BinaryCmd" and node.get("Op") in ("|", "|&"):
            yield node
            return
        for v in node.values():
            yield from _pipes(v)
    elif isinstance(node, list):
        for v in node:
            yield from _pipes(v)


def _stages(node: dict) -> list[dict]:
    """The statements of a pipeline, left to right (bash's `a | b | c` nests to the left)."""
    x = node["X"].get("Cmd") or {}
    left = _stages(x) if x.get("Type") == "BinaryCmd" and x.get("Op") in ("|", "|&") else [node["X"]]
    return left + [node["Y"]]


def _read_only(stmt: dict) -> bool:
    """A simple command from READ_ONLY, with no word that writes and no output redirect."""
    words = pl._consumer_words(stmt) if (stmt.get("Cmd") or {}).get("Type") == "CallExpr" else None
    if not words or words[0] is None or Path(words[0]).name not in READ_ONLY:
        return False
    if any(w in WRITES for w in words if w):
        return False
    return all(
        ">" not in (rd.get("Op") or "") or pl._word(rd.get("Word") or {}) == "/dev/null"
        for rd in stmt.get("Redirs") or []
    )


LOOP = r"""
n=$1; shift; p=$1
idle=$(bash -o pipefail -c "$p" >/dev/null 2>&1; echo $?)
bad=0; codes=""
for i in $(seq "$n"); do
  bash -o pipefail -c "$p" >/dev/null 2>&1; rc=$?
  if [ "$rc" != "$idle" ]; then bad=$((bad+1)); codes="$codes $rc"; fi
done
echo "RESULT idle=$idle bad=$bad codes=$codes"
"""


def stress(image: str, todo: dict[str, dict], runs: int, load: int) -> list[dict]:
    docker = buildkit.build_cli()
    name = f"pipefail-stress-{os.getpid()}"
    subprocess.run(
        [docker, "run", "-d", "--rm", "--name", name, "--entrypoint", "sleep", image, "infinity"],
        check=True,
        capture_output=True,
    )
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(load)]
    results = []
    try:
        for src, e in sorted(todo.items(), key=lambda kv: (not kv[1]["flagged"], kv[0])):
            t0 = time.monotonic()
            r = subprocess.run(
                [docker, "exec", name, "bash", "-c", LOOP, "loop", str(runs), src],
                capture_output=True,
                text=True,
                timeout=3600,
                check=False,
            )
            line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), "RESULT idle=? bad=?")
            kv = dict(x.split("=", 1) for x in line.split()[1:3])
            codes = sorted(set(line.split("codes=", 1)[1].split())) if "codes=" in line else []
            results.append(
                {
                    "pipeline": src,
                    "block": e["block"],
                    "cells": len(e["cells"]),
                    "flagged": e["flagged"],
                    "runs": runs,
                    "idle_rc": kv.get("idle"),
                    "failures": int(kv.get("bad", "0") or 0),
                    "exit_codes": codes,
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            print(f"  {results[-1]['failures']:>4}/{runs}  {src[:100]}", file=sys.stderr, flush=True)
    finally:
        for h in hogs:
            h.kill()
        subprocess.run([docker, "rm", "-f", name], capture_output=True, check=False)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True, help="a built image the checks run in")
    ap.add_argument("--rev", help="render the cells of this git revision (default: the working tree)")
    ap.add_argument("--runs", type=int, default=300, help="runs of each pipeline (default 300)")
    ap.add_argument("--load", type=int, default=2 * (os.cpu_count() or 1), help="busy loops on the host")
    ap.add_argument("--out", default="reports/pipefail-stress.json")
    a = ap.parse_args()
    todo = pipelines(checked_out(a.rev))
    print(
        f"{len(todo)} read-only pipeline(s) in the rendered RUN lines of {a.rev or 'the working tree'}; "
        f"{a.runs} runs each in {a.image} under {a.load} busy loops",
        file=sys.stderr,
    )
    res = stress(a.image, todo, a.runs, a.load)
    chance = [r for r in res if r["failures"]]
    print("| pipeline | block | cells | flagged by pipefail_lint | runs | failures | exit codes |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        print(
            f"| `{r['pipeline']}` | {r['block']} | {r['cells']} | {'yes' if r['flagged'] else 'no'} | {r['runs']} "
            f"| {r['failures']} | {' '.join(r['exit_codes']) or '-'} |"
        )
    print(
        f"\n{sum(r['runs'] for r in res)} runs, {sum(r['failures'] for r in res)} failure(s) by chance in "
        f"{len(chance)} pipeline(s)"
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(
        json.dumps({"image": a.image, "rev": a.rev, "load": a.load, "results": res}, indent=2) + "\n"
    )
    return 1 if chance else 0


if __name__ == "__main__":
    sys.exit(main())
