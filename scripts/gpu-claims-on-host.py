"""The gpu tier's claims on broken variants (expect.json's ``gpu_must_fail``), judged on a bare GPU
host (no Docker): each claimed check's own code runs against a target backed by this host's
Python, once as the host is (the control: it must pass) and once with the variant's defect
reproduced in the environment the check's commands run in; the failure must match the claim's
pattern (tests/conformance/verdict.py). What a GPU runner does with the built variant
(scripts/gpu-variants.sh), for the defects a process environment can reproduce.

    python3 scripts/gpu-claims-on-host.py [OUT.json]

Variants and how their defect is reproduced here (DEFECTS): no-c-compiler -- no C compiler on
PATH and no CC, as the variant deletes them from the image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conformance import verdict  # noqa: E402
from trainbase_conformance.fixtures import PROBE_DIR  # noqa: E402


def _no_compiler(scratch: Path) -> dict[str, str]:
    """The environment without a C compiler: PATH is a bin/ of links to the few tools a probe's
    shell needs (the interpreter is called by its absolute path), none of cc, gcc, clang, c++,
    and no CC/CXX -- what no-c-compiler leaves in the image."""
    bin_ = scratch / "bin"
    bin_.mkdir()
    for tool in ("sh", "env", "ls", "cat", "ldconfig"):
        if found := shutil.which(tool) or (f"/sbin/{tool}" if os.path.exists(f"/sbin/{tool}") else None):
            (bin_ / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    return {**env, "PATH": str(bin_)}


DEFECTS = {"no-c-compiler": _no_compiler}


class HostTarget:
    """What the gpu tier's checks read of a target, answered by this host: its Python (the
    image's, inside a container), the probes at PROBE_DIR, a manifest naming PyTorch."""

    def __init__(self, env: dict[str, str], scratch: Path):
        import torch

        self.env, self.scratch = env, scratch
        self.python = sys.executable
        self.name = "host"
        self.manifest = {"frameworks": {"pytorch": torch.__version__.split("+")[0]}}
        self.components = {}
        self.cache = {}

    def sh(self, cmd: str, timeout: int = 600):
        env = {
            **self.env,
            "TORCHINDUCTOR_CACHE_DIR": str(self.scratch / "inductor"),
            "TRITON_CACHE_DIR": str(self.scratch / "triton"),
        }  # nothing compiled before is reused
        p = subprocess.run(
            ["/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        return SimpleNamespace(stdout=p.stdout, stderr=p.stderr, rc=p.returncode)


def _run(check, target) -> tuple[str, str, float]:
    t = time.monotonic()
    try:
        check(target)
    except AssertionError as e:
        return "failed", f"AssertionError: {e}", time.monotonic() - t
    except Exception as e:  # noqa: BLE001 -- a crash of the check is an error, never a rejection
        return "error", f"{type(e).__name__}: {e}", time.monotonic() - t
    return "passed", "", time.monotonic() - t


def main() -> int:
    import importlib

    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    probes = Path(PROBE_DIR)
    if not probes.exists():
        probes.symlink_to(ROOT / "trainbase_conformance" / "probes")
    results, bad = [], 0
    for variant, defect in DEFECTS.items():
        expect = json.loads((verdict.BROKEN / variant / "expect.json").read_text())
        for check_name, want in verdict.expectations(expect, verdict.GPU_CLAIMS).items():
            path = next(
                p
                for p in expect["gpu_paths"]
                if check_name in (ROOT / "trainbase_conformance" / "checks" / p).read_text()
            )
            check = getattr(importlib.import_module(f"trainbase_conformance.checks.{path[:-3]}"), check_name)
            row = {"variant": variant, "check": check_name, "pattern": want.pattern}
            for label, make_env in (("control", lambda s: dict(os.environ)), ("variant", defect)):
                with tempfile.TemporaryDirectory(prefix=f"tb-{label}-") as d:
                    state, message, took = _run(check, HostTarget(make_env(Path(d)), Path(d)))
                row[label] = {"state": state, "message": message[:2000], "seconds": round(took, 1)}
            case = verdict.Case(
                f"{check_name}[host:{variant}]", check_name, row["variant"]["state"], row["variant"]["message"]
            )
            problems = verdict.judge({check_name: want}, [case])
            if row["control"]["state"] != "passed":
                problems.insert(0, f"the control did not pass on this host: {row['control']}")
            row["proven"], row["problems"] = not problems, problems
            bad += bool(problems)
            results.append(row)
            print(
                f"{variant}: {check_name}: control {row['control']['state']} ({row['control']['seconds']} s), "
                f"variant {row['variant']['state']} ({row['variant']['seconds']} s): "
                f"{'PROVEN' if not problems else 'NOT proven'}\n  message: {verdict.one_line(row['variant']['message'], 700)}"
            )
            for p in problems:
                print(f"  - {p}")
    if out_path:
        out_path.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
