"""docs/matrix.md's "Add a CUDA version", followed to the end with PyPI: the row the page shows,
added as a new CUDA version the way the page says, is locked by `build.py --lock` for real (pip's
resolver against PyPI, hashes included), rendered, and planned. The unit tests follow the same
page up to the lock; this is the step they cannot take without the network."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from ..conftest import ROOT
from ..unit.test_docs_add_a_version import _documented_entries


def _cli(scratch, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *args, "--file", str(scratch / "matrix.yaml")],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_a_cuda_row_added_as_the_page_says_locks_renders_and_plans(scratch):
    [(shown, row)] = _documented_entries()["cuda"].items()
    data = yaml.safe_load((scratch / "matrix.yaml").read_text())
    data["axes"]["cuda"].append("13.9")
    data["cuda"]["13.9"] = dict(row, toolkit="13.9.0")
    (scratch / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    # the base images of the row on the Debian line: the lock sets a new row brings first
    select = ["--select", "cuda=13.9", "--select", "framework=none", "--select", "os=debian12"]
    r = _cli(scratch, "--lock", *select)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    written = sorted(p.name for p in (scratch / "locks").glob("*cuda13.9*.txt"))
    assert {"cuda13.9-py3.11.txt", "nccl2.30.7-cuda13.9-py3.11.txt"} <= set(written), (
        f"the new row's Debian base is not locked: {written}\n{r.stdout[-1500:]}"
    )
    locked = "".join((scratch / "locks" / n).read_text() for n in written)
    # every wheel the row pins is locked at its pinned version, with its hash
    for wheel in row["wheels"].values():
        pin = f"{wheel['package']}=={wheel['version']} \\\n    --hash=sha256:"
        assert pin in locked, f"{wheel['package']}=={wheel['version']} is not locked with a hash in {written}"
    lock = (scratch / "locks" / "cuda13.9-py3.11.txt").read_text()

    # the same row under its own name resolves to the lock committed for it: the page's steps
    # reproduce what is in locks/, not something near it
    def body(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if not ln.startswith("#")]

    assert body(lock) == body((ROOT / "locks" / f"cuda{shown}-py3.11.txt").read_text()), (
        f"the page's row locked to something else than locks/cuda{shown}-py3.11.txt:\n{lock[:1500]}"
    )
    plan = _cli(scratch, "--matrix", "--dry-run", *select, "--select", "platform=linux/amd64")
    assert plan.returncode == 0, plan.stdout[-1500:] + plan.stderr[-1500:]
    assert "openmpi5.0.11-cuda13.9-cudnn9-debian12:r" in plan.stdout, plan.stdout[-1500:]
