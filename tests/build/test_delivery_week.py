"""A week of delivery against the loopback registry, day by day: recipes staged (immutable
tags pushed, their signed SBOM + provenance attached), GPU-tier and scan results injected as
the gate records gpu.yml writes (pass, fail, missing, a job that expired in the queue and so
wrote nothing, a record for another digest), promotion run through the same Python as
`build.py --promote --gate`, the mirror step after it, and a revert. After each day the test
asserts what `latest` points to in the primary and in the mirror, and the table of the week is
written to reports/delivery-week.md. The alias must only ever move to a digest with a pass
record from every required check, and back again when a recipe is reverted; the mirror
follows the primary's promotions and nothing else, attestations included."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainbase.deliver import attest, mirror, promote
from trainbase.deliver import registry as regmod
from trainbase.supply import vulnscan

from .conftest import ROOT
from .test_registry_side import _keypair

pytestmark = pytest.mark.engine
PLATFORM = "linux/amd64"
REPO = "trainbase/week-openmpi"
MIRROR = "mirror/week-openmpi"


def _stage(docker, registry, tmp_path: Path, tag: str, content: str, key: Path) -> str:
    """A tiny image (FROM scratch, one file) pushed as REPO:TAG with its signed SBOM and
    provenance attached, what `--push stage --sign-key` does to a built cell; its digest."""
    ctx = tmp_path / tag
    ctx.mkdir()
    (ctx / "recipe").write_text(content)
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY recipe /recipe\n")
    ref = f"{registry.host}/{REPO}:{tag}"
    for args in (["build", "-t", ref, str(ctx)], ["push", ref]):
        r = subprocess.run(
            [docker, "--config", str(registry.config), *args],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
            check=False,
        )
        assert r.returncode == 0, r.stderr[-1500:]
    docs = tmp_path / "supply" / "week-openmpi" / tag
    docs.mkdir(parents=True)
    (docs / "sbom.cdx.json").write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6"}))
    (docs / "inputs.lock.json").write_text(json.dumps({"tag": tag, "inputs": {}}))
    attest.Attester(f"{registry.host}/trainbase", tmp_path / "supply", key, io.StringIO()).attach(
        SimpleNamespace(name="week-openmpi", tag=tag, platform=PLATFORM, image=ref), REPO, tag
    )
    return registry.digest(REPO, tag)


def _record(gate: Path, name: str, ref: str, check: str, passed: bool) -> None:
    """A gate record as gpu.yml's jobs write them (one file per job's artifact)."""
    doc = {"ref": ref, "check": check, "passed": passed}
    if check == promote.GPU_TIER:
        doc["platform"] = PLATFORM
    (gate / f"{name}.json").write_text(json.dumps(doc))


def _promote(registry, tag: str, gate: Path) -> tuple[int, int, str]:
    """One promotion run for the cell whose current recipe tag is ``tag``: (promoted, held, log)."""
    out = io.StringIO()
    steps = promote.plan(
        [("week-openmpi", tag)], f"{registry.host}/trainbase", regmod.digest, {"week-openmpi": [PLATFORM]}
    )
    promoted, held = promote.promote(steps, promote.read_gate(gate), regmod.retag, regmod.digest, out)
    return promoted, held, out.getvalue()


def test_a_week_of_delivery_moves_latest_only_on_a_full_pass(registry, docker, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    gpu, scan = promote.GPU_TIER, vulnscan.CHECK
    host = registry.host
    by_digest = lambda d: f"{host}/{REPO}@{d}"  # noqa: E731
    t1, t2, t3 = "r" + "1" * 12, "r" + "2" * 12, "r" + "3" * 12
    days, names = [], {}
    key, pub = _keypair(tmp_path, "week")

    def day(
        label: str,
        tag: str,
        gate_records: list[tuple[str, str, bool]],
        want: str | None,
        what: str,
        held_because: str = "",
    ):
        gate = tmp_path / f"gate-{len(days)}"
        gate.mkdir()
        for i, (digest, check, passed) in enumerate(gate_records):
            _record(gate, f"{check}-{i}", by_digest(digest), check, passed)
        promoted, held, log = _promote(registry, tag, gate)
        latest = registry.digest(REPO, "latest")
        assert latest == want, f"{label}: latest is {latest}, expected {want}\n{log}"
        if held_because:
            assert held == 1 and promoted == 0 and held_because in log, f"{label}: {log}"
        # the mirror step (build.yml's mirror job, after promotion): the release tag and latest
        # by digest, with the attestations; a held recipe is not mirrored
        mirrored = mirror.mirror_one(f"{host}/trainbase", f"{host}/mirror", "week-openmpi", tag, io.StringIO())
        mirror_latest = registry.digest(MIRROR, "latest")
        if held_because:
            assert "not promoted yet" in mirrored, f"{label}: the mirror took a held recipe: {mirrored}"
        else:
            assert mirror_latest == latest, f"{label}: mirror latest {mirror_latest}, primary {latest}: {mirrored}"
            assert (
                attest.verify_command(None, tmp_path, [], f"{host}/{MIRROR}:latest", None, str(pub), out=io.StringIO())
                == 0
            ), f"{label}: the mirror's latest is not attested"
        days.append(
            (
                label,
                tag,
                what,
                names.get(latest, "absent"),
                names.get(mirror_latest, "absent"),
                log.strip().splitlines()[-1],
            )
        )

    d1 = _stage(docker, registry, tmp_path, t1, "monday", key)
    names[d1] = f"{t1} ({d1[:19]})"
    day("Mon", t1, [(d1, gpu, True), (d1, scan, True)], d1, "r1 staged; GPU tier and scan pass")

    d2 = _stage(docker, registry, tmp_path, t2, "tuesday", key)
    names[d2] = f"{t2} ({d2[:19]})"
    day(
        "Tue",
        t2,
        [(d2, scan, True)],
        d1,
        "r2 staged; the GPU job expired in the queue (no runner): no record",
        held_because=f"missing {promote.gpu_check(PLATFORM)}",
    )
    day(
        "Wed",
        t2,
        [(d2, gpu, False), (d2, scan, True)],
        d1,
        "GPU tier fails on r2",
        held_because=f"failed {promote.gpu_check(PLATFORM)}",
    )
    day("Thu", t2, [(d2, gpu, True)], d1, "GPU tier passes; the scan left no record", held_because=f"missing {scan}")
    day("Fri", t2, [(d2, gpu, True), (d2, scan, True), (d1, gpu, True)], d2, "every required check passes r2")
    # the recipe reverted to r1 (its immutable tag is still published): the alias follows it
    # back on r1's own records, and only on them
    day("Sat", t1, [(d1, gpu, True), (d1, scan, True)], d1, "r2 reverted: the recipe is r1 again")
    d3 = _stage(docker, registry, tmp_path, t3, "sunday", key)
    names[d3] = f"{t3} ({d3[:19]})"
    day(
        "Sun",
        t3,
        [(d2, gpu, True), (d2, scan, True), (d3, gpu, True)],
        d1,
        "refresh stages r3; passes exist for r2 and for r3's GPU tier only",
        held_because=f"missing {scan}",
    )

    table = [
        "| day | recipe | what happened | `latest` after the day | mirror's `latest` | promotion |",
        "|---|---|---|---|---|---|",
    ]
    table += [f"| {d} | {t} | {w} | {latest} | {m} | {p} |" for d, t, w, latest, m, p in days]
    out = ROOT / "reports" / "delivery-week.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(table) + "\n")
    print("\n".join(table))
