"""A month of delivery against the loopback registry (issue 52): two repositories -- one
single-platform with its ``-zstd`` twin, one multi-arch index (amd64 + arm64, each platform
staged, attested and merged as build.yml does) -- through the days a month of real use brings:
a flaky GPU cell, the arm64 GPU pool offline for three days, an attestation step that failed
after the push, a stale re-run, two racing pushes, a critical CVE in a promoted digest, a mirror
down for a day, a refresh proposal that touches ``scripts/`` (refused), a dispatch from a branch.

Each day runs what the workflows run, through the same Python: images pushed and attested
(deliver/attest.py), the gate records gpu.yml's jobs write (the scan ones through
supply/vulnscan.py on a Trivy report, one per platform), the promotion (deliver/promote.py with
the attestation check and main's head), the plan of the next build (ci_matrix), the mirror
(deliver/mirror.py, the mirror's login in its own DOCKER_CONFIG). After each day the test
asserts where every tag of every repository points, in the primary and the mirror, and writes
the table of the month to reports/delivery-month.md: what each tag points at, and why.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from trainbase.deliver import (
    attest,
    ci_matrix,
    mirror,
    platforms,
    promote,
    refresh_patch,
)
from trainbase.deliver import registry as regmod
from trainbase.deliver.publish import ZSTD, staging_repo
from trainbase.supply import vulnscan

from .conftest import ROOT
from .test_registry_side import _keypair

pytestmark = pytest.mark.engine
NS = "trainbase"
ONE = "month-openmpi"  # linux/amd64 only, with a zstd twin
MULTI = "month-torch"  # one index: linux/amd64 + linux/arm64
AMD, ARM = "linux/amd64", "linux/arm64"
PLATFORMS = {ONE: [AMD], MULTI: [AMD, ARM]}
CLEAN = {"SchemaVersion": 2, "ArtifactName": "x", "Results": []}
CRITICAL = {
    "SchemaVersion": 2,
    "ArtifactName": "x",
    "Results": [
        {
            "Class": "os-pkgs",
            "Type": "debian",
            "Vulnerabilities": [
                {
                    "VulnerabilityID": "CVE-2026-52052",
                    "PkgName": "libssl3",
                    "InstalledVersion": "3.0.17-1",
                    "FixedVersion": "3.0.18-1",
                    "Severity": "CRITICAL",
                    "Title": "a critical, fixable CVE found after promotion",
                }
            ],
        }
    ],
}


class Month:
    """The registry, the keys and the bookkeeping of the month."""

    def __init__(self, docker: str, registry, tmp_path: Path):
        self.docker, self.registry, self.tmp = docker, registry, tmp_path
        self.host = registry.host
        self.key, self.pub = _keypair(tmp_path, "month")
        self.names: dict[str, str] = {}  # digest -> "r3 (sha256:...)"
        self.rows: list[str] = []
        self.head = ""  # main's head commit
        self.recipe: dict[str, str] = {}  # repository -> its recipe tag at main's head
        # the mirror's login kept apart from the primary's (kind: ghcr on the primary's host)
        self.mirror_config = tmp_path / "mirror-docker-config"
        self.mirror_config.mkdir()
        shutil.copy(registry.config / "config.json", self.mirror_config / "config.json")
        self.clients: dict = {}
        self.scans = 0

    # -- what build-cells + merge-platforms do ---------------------------------------------------
    def _image(self, ref: str, content: str, platform: str) -> None:
        ctx = self.tmp / "ctx" / ref.replace("/", "_").replace(":", "_")
        ctx.mkdir(parents=True)
        (ctx / "recipe").write_text(content)
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY recipe /recipe\n")
        for args in (["build", "--platform", platform, "-t", ref, str(ctx)], ["push", ref]):
            r = subprocess.run(
                [self.docker, "--config", str(self.registry.config), *args],
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "DOCKER_BUILDKIT": "1"},
                check=False,
            )
            assert r.returncode == 0, r.stderr[-1500:]

    def _attest(self, name: str, tag: str, platform: str, image: str, repo: str, ref: str) -> None:
        docs = self.tmp / "supply" / name / tag
        docs.mkdir(parents=True, exist_ok=True)
        (docs / "sbom.cdx.json").write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6"}))
        (docs / "inputs.lock.json").write_text(json.dumps({"tag": tag, "inputs": {}}))
        attest.Attester(f"{self.host}/{NS}", self.tmp / "supply", self.key, io.StringIO()).attach(
            SimpleNamespace(name=name, tag=tag, platform=platform, image=image), repo, ref
        )

    def stage(self, repo: str, tag: str, attested: bool = True) -> str:
        """Build, push and (unless the attest step fails after the push) attest REPO:TAG -- for
        the multi-arch repository each platform staged and attested, then the index merged over
        them with their attestations carried (platforms.py); for the single one its zstd twin
        too. The digest of the release tag."""
        if repo == ONE:
            ref = f"{self.host}/{NS}/{ONE}:{tag}"
            self._image(ref, f"{ONE} {tag}", AMD)
            regmod.zstd_twin(ref, f"{ref}{ZSTD}")
            if attested:
                for r in (tag, f"{tag}{ZSTD}"):
                    self._attest(ONE, tag, AMD, ref, f"{NS}/{ONE}", r)
        else:
            cells = [SimpleNamespace(name=MULTI, platform=AMD), SimpleNamespace(name=f"{MULTI}-arm64", platform=ARM)]
            for c in cells:
                ref = f"{self.host}/{staging_repo(NS, c.name)}:{tag}"
                self._image(ref, f"{MULTI} {tag} {c.platform}", c.platform)
                if attested:
                    self._attest(c.name, tag, c.platform, ref, staging_repo(NS, c.name), tag)
            platforms._index_of_staged(
                self.host, f"{NS}/{MULTI}", tag, {c.platform: (staging_repo(NS, c.name), tag) for c in cells}
            )
            platforms._carry_attestations(self.host, NS, MULTI, cells, {c.name: tag for c in cells}, io.StringIO())
        d = self.registry.digest(f"{NS}/{repo}", tag)
        self.names[d] = f"{tag} ({d[7:19]})"
        twin = self.registry.digest(f"{NS}/{repo}", f"{tag}{ZSTD}")
        if twin:
            self.names[twin] = f"{tag}{ZSTD} ({twin[7:19]})"
        return d

    def reattest(self, repo: str, tag: str) -> None:
        """The next build's re-attestation of a digest found published without its attestations."""
        ref = f"{self.host}/{NS}/{repo}:{tag}"
        for r in (tag, f"{tag}{ZSTD}"):
            self._attest(repo, tag, AMD, ref, f"{NS}/{repo}", r)

    def plan_unpublished(self) -> dict[str, list[str]]:
        """What build.yml's plan (`--only unpublished`) keeps of the head recipes: name -> what it lacks."""
        items = [
            {"name": repo, "tag": tag, "repository": repo, "release_tag": tag} for repo, tag in self.recipe.items()
        ]
        clients: dict = {}
        kept, _ = ci_matrix.with_registry_state(
            items,
            f"{self.host}/{NS}",
            "unpublished",
            regmod.digest,
            lambda h, repo, d: attest.unattested(clients.setdefault(h, attest.referrers.Client(h)), repo, d),
        )
        return {e["name"]: e.get("attest", ["not published"]) for e in kept}

    # -- what gpu.yml does -----------------------------------------------------------------------
    def records(
        self,
        gate: Path,
        repo: str,
        digest: str,
        gpu: dict[str, bool | None],
        scan: dict | None = None,
        twin: bool = True,
    ) -> None:
        """The gate records gpu.yml's jobs leave for REPO@DIGEST: the gpu job's per platform
        (None: no runner online, so no job and no record), the scan job's per platform through
        vulnscan on a Trivy report (and the zstd twin's, scanned as its own digest)."""
        ref = f"{self.host}/{NS}/{repo}@{digest}"
        for platform, passed in gpu.items():
            if passed is not None:
                d = gate / f"gate-{repo}-{platform.split('/')[1]}-{len(list(gate.iterdir()))}"
                d.mkdir()
                (d / "gate.json").write_text(
                    json.dumps({"ref": ref, "check": "gpu", "platform": platform, "passed": passed})
                )
        refs = [ref]
        twin_digest = self.registry.digest(f"{NS}/{repo}", f"{self.tag_of(repo, digest)}{ZSTD}") if twin else None
        if twin_digest:
            refs.append(f"{self.host}/{NS}/{repo}@{twin_digest}")
        for r in refs:
            for platform in PLATFORMS[repo]:
                self.scans += 1
                report = self.tmp / f"trivy-{self.scans}.json"
                report.write_text(json.dumps(scan or CLEAN))
                vulnscan.main(
                    [
                        str(report),
                        "--ref",
                        r,
                        "--cell",
                        repo,
                        "--platform",
                        platform,
                        "--allowlist",
                        str(ROOT / "audit-allowlist.yaml"),
                        "--gate-dir",
                        str(gate / f"gate-scan-{repo}-{len(list(gate.iterdir()))}"),
                    ]
                )

    def tag_of(self, repo: str, digest: str) -> str:
        return self.names.get(digest, "?").split(" ")[0]

    def promote(self, gate: Path, recipe_sha: str, tags: dict[str, str] | None = None) -> str:
        """gpu.yml's promote job for a run whose recipe is commit RECIPE_SHA (its recipe tags)."""
        tags = tags or self.recipe
        out = io.StringIO()
        steps = promote.plan(
            sorted(tags.items()), f"{self.host}/{NS}", regmod.digest, {repo: PLATFORMS[repo] for repo in tags}
        )
        promote.promote(
            steps,
            promote.read_gate(gate),
            regmod.retag,
            regmod.digest,
            out,
            attested=attest.attestation_check(str(self.pub)),
            recipe_sha=recipe_sha,
            head_sha=self.head,
        )
        return out.getvalue()

    def mirror(self, to: str) -> str:
        out = io.StringIO()
        src = f"{self.host}/{NS}"
        mirror.mirror_all(
            src,
            [to],
            dict(self.recipe),
            out,
            lambda dst, repo, tag: mirror.mirror_one(
                src,
                dst,
                repo,
                tag,
                out,
                clients=self.clients,
                src_config=self.registry.config,
                dst_config=self.mirror_config,
            ),
        )
        return out.getvalue()

    # -- the table -------------------------------------------------------------------------------
    def point(self, repo: str, tag: str, where: str = NS) -> str | None:
        return self.registry.digest(f"{where}/{repo}", tag)

    def readable(self, text: str) -> str:
        """A log line for the table: each digest by its tag's name, the loopback host left out."""
        import re

        text = re.sub(r"sha256:[0-9a-f]{64}", lambda m: self.names.get(m.group(0), m.group(0)[:19]), text)
        return text.replace(f"{self.host}/", "")

    def row(self, day: str, what: str, log: str, mirror_log: str) -> None:
        for repo in (ONE, MULTI):
            why = [
                line.split(f"promote: {repo}: ", 1)[1]
                for line in log.splitlines()
                if line.startswith(f"promote: {repo}: ")
            ]
            if not any(w.startswith("latest is already") for w in why):
                why += [
                    line.split("promote: ", 1)[1] for line in log.splitlines() if line.startswith("promote: NOTHING")
                ]
            why += [
                f"mirror: {line.split(': ', 2)[2]}"
                for line in mirror_log.splitlines()
                if line.startswith("mirror: ") and f"/{repo}: " in line
            ]
            why = [self.readable(w) for w in why]
            cells = [self.names.get(self.point(repo, t) or "", "absent") for t in ("latest", f"latest{ZSTD}")]
            if repo == MULTI:
                cells[1] = "(no twin)"
            mirrored = self.names.get(self.point(repo, "latest", "mirror") or "", "absent")
            self.rows.append(
                f"| {day} | {what if repo == ONE else ''} | {repo} | {cells[0]} | {cells[1]} | "
                f"{mirrored} | {'; '.join(why).replace('|', '/') or 'nothing to do'} |"
            )
            what = ""


@pytest.mark.slow
def test_a_month_of_delivery(registry, docker, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    mo = Month(docker, registry, tmp_path)
    mirror_to = f"{registry.host}/mirror"
    down = "127.0.0.1:9/mirror"  # the discard port: nothing listens, the mirror is down

    def day(
        label: str,
        what: str,
        *,
        run_sha: str | None = None,
        records=(),
        mirror_up: bool = True,
        tags: dict[str, str] | None = None,
    ) -> str:
        gate = tmp_path / f"gate-{label.replace(' ', '-')}"
        gate.mkdir()
        for args, kw in records:
            mo.records(gate, *args, **kw)
        log = mo.promote(gate, run_sha or mo.head, tags)
        mlog = mo.mirror(mirror_to if mirror_up else down)
        mo.row(label, what, log, mlog)
        return log + mlog

    def latest(repo, where=NS):
        return mo.point(repo, "latest", where)

    def twin_latest(repo):
        return mo.point(repo, f"latest{ZSTD}")

    ok = {AMD: True}
    ok2 = {AMD: True, ARM: True}

    # Dec 1: the first recipes of both repositories; every check passes, every platform scanned
    mo.head = "c01" + "0" * 37
    a1, b1 = mo.stage(ONE, "r1a"), mo.stage(MULTI, "r1b")
    mo.recipe = {ONE: "r1a", MULTI: "r1b"}
    day("Dec 01", "first recipes: every check passes", records=[((ONE, a1, ok), {}), ((MULTI, b1, ok2), {})])
    twin1 = mo.point(ONE, "r1a" + ZSTD)
    assert (latest(ONE), twin_latest(ONE), latest(MULTI)) == (a1, twin1, b1)
    assert (latest(ONE, "mirror"), latest(MULTI, "mirror"), mo.point(ONE, f"latest{ZSTD}", "mirror")) == (a1, b1, twin1)
    # the mirror's index carries each platform's signed attestations
    assert (
        attest.attestation_problems(
            attest.referrers.Client(registry.host), f"mirror/{MULTI}", b1, attest.att.load_public_key(mo.pub)
        )
        == []
    )

    # Dec 2: a flaky GPU cell: r2a fails its GPU job; r2b passes -- and moves, on its own verdict
    mo.head = "c02" + "0" * 37
    a2, b2 = mo.stage(ONE, "r2a"), mo.stage(MULTI, "r2b")
    mo.recipe = {ONE: "r2a", MULTI: "r2b"}
    log = day(
        "Dec 02", "flaky GPU cell: r2a's GPU job fails", records=[((ONE, a2, {AMD: False}), {}), ((MULTI, b2, ok2), {})]
    )
    assert latest(ONE) == a1 and latest(MULTI) == b2 and "failed gpu[linux/amd64]" in log
    assert latest(MULTI, "mirror") == b2 and latest(ONE, "mirror") == a1

    # Dec 3: the GPU job re-run passes; the twin's scan has not run yet: latest moves, latest-zstd stays
    day("Dec 03", "r2a's GPU job re-run passes; its twin not scanned yet", records=[((ONE, a2, ok), {"twin": False})])
    assert latest(ONE) == a2 and twin_latest(ONE) == twin1
    day("Dec 04", "nightly: r2a's twin scanned", records=[((ONE, a2, ok), {})])
    assert twin_latest(ONE) == mo.point(ONE, "r2a" + ZSTD)

    # Dec 5-7: the arm64 GPU pool is offline: r3b's arm64 job never runs (no record), held three
    # days, named; r3a passes on Dec 5 and moves regardless
    a3, b3 = mo.stage(ONE, "r3a"), mo.stage(MULTI, "r3b")
    mo.head, mo.recipe = "c05" + "0" * 37, {ONE: "r3a", MULTI: "r3b"}
    for n, label in enumerate(("Dec 05", "Dec 06", "Dec 07")):
        log = day(
            label,
            f"arm64 GPU pool offline (day {n + 1} of 3)",
            records=[((ONE, a3, ok), {}), ((MULTI, b3, {AMD: True, ARM: None}), {})],
        )
        assert latest(MULTI) == b2 and latest(ONE) == a3
        assert f"{MULTI}: NOT promoted" in log and "missing gpu[linux/arm64]" in log
    day("Dec 08", "arm64 pool back: r3b's arm64 job passes", records=[((MULTI, b3, ok2), {})])
    assert latest(MULTI) == b3 and latest(MULTI, "mirror") == b3

    # Dec 9: the attest step fails after r4a's push: every gate record passes, the digest is
    # refused; the next build's plan keeps the published, unattested digest
    mo.head = "c09" + "0" * 37
    a4 = mo.stage(ONE, "r4a", attested=False)
    mo.recipe = {ONE: "r4a", MULTI: "r3b"}
    log = day("Dec 09", "r4a pushed, its attest step failed", records=[((ONE, a4, ok), {})])
    assert latest(ONE) == a3 and "is not attested" in log and "nothing attached" in log
    plan = mo.plan_unpublished()
    assert list(plan) == [ONE] and any("provenance" in p for p in plan[ONE])
    mo.reattest(ONE, "r4a")
    assert mo.plan_unpublished() == {}
    day("Dec 10", "the next build re-attests r4a", records=[((ONE, a4, ok), {})])
    assert latest(ONE) == a4 and twin_latest(ONE) == mo.point(ONE, "r4a" + ZSTD)

    # Dec 11: a stale re-run: Dec 2's run (recipe r2a, commit c02) has its flaky job re-run and
    # passing; main's head is c09: nothing moves backwards
    log = day(
        "Dec 11",
        "stale re-run of Dec 2's run (recipe r2a)",
        run_sha="c02" + "0" * 37,
        records=[((ONE, a2, ok), {})],
        tags={ONE: "r2a", MULTI: "r2b"},
    )
    assert latest(ONE) == a4 and latest(MULTI) == b3 and "NOTHING promoted" in log and "main's head is c09" in log

    # Dec 12: two racing pushes: c12a (r5a) then c12b (r6a) land minutes apart; c12b's run
    # promotes first, c12a's finishes later: it is not the head, so it moves nothing
    a5, a6 = mo.stage(ONE, "r5a"), mo.stage(ONE, "r6a")
    mo.head, mo.recipe = "c12b" + "0" * 36, {ONE: "r6a", MULTI: "r3b"}
    day("Dec 12", "racing pushes: c12b's run (r6a) promotes", records=[((ONE, a6, ok), {})])
    log = day(
        "Dec 12+",
        "racing pushes: c12a's run (r5a) finishes later",
        run_sha="c12a" + "0" * 36,
        records=[((ONE, a5, ok), {})],
        tags={ONE: "r5a", MULTI: "r3b"},
    )
    assert latest(ONE) == a6 and "NOTHING promoted" in log

    # Dec 13: a critical CVE in the promoted r3b: the nightly scan fails it; r7a still moves;
    # Dec 14: the security rebuild r4b passes and replaces it
    a7 = mo.stage(ONE, "r7a")
    mo.head, mo.recipe = "c13" + "0" * 37, {ONE: "r7a", MULTI: "r3b"}
    day(
        "Dec 13",
        "critical CVE in promoted r3b (nightly scan); r7a staged",
        records=[((ONE, a7, ok), {}), ((MULTI, b3, ok2), {"scan": CRITICAL})],
    )
    assert latest(ONE) == a7 and latest(MULTI) == b3
    b4 = mo.stage(MULTI, "r4b")
    mo.head, mo.recipe = "c14" + "0" * 37, {ONE: "r7a", MULTI: "r4b"}
    day("Dec 14", "security rebuild r4b (fixed libssl3)", records=[((MULTI, b4, ok2), {})])
    assert latest(MULTI) == b4

    # Dec 15: the mirror is down: the primary promotes r8a, the mirror reports each repository
    # and keeps r7a; Dec 16: it is back and catches up
    a8 = mo.stage(ONE, "r8a")
    mo.head, mo.recipe = "c15" + "0" * 37, {ONE: "r8a", MULTI: "r4b"}
    log = day("Dec 15", "mirror down", records=[((ONE, a8, ok), {})], mirror_up=False)
    assert latest(ONE) == a8 and latest(ONE, "mirror") == a7 and latest(MULTI, "mirror") == b4
    assert log.count("FAILED") == 2  # each repository reported, neither stopped the other
    day("Dec 16", "mirror back: catches up")
    assert latest(ONE, "mirror") == a8 and mo.point(ONE, f"latest{ZSTD}", "mirror") == mo.point(ONE, "r8a" + ZSTD)

    # Dec 17: the refresh proposes a patch touching scripts/refresh-pr.sh (and .github/): the
    # write job refuses it by name, nothing is applied, built or promoted
    patch = "".join(
        f"diff --git a/{p} b/{p}\n--- a/{p}\n+++ b/{p}\n@@ -1 +1 @@\n-old\n+new\n"
        for p in ("locks/bases.json", "scripts/refresh-pr.sh", ".github/workflows/build.yml")
    )
    refused = refresh_patch.refused_paths(patch)
    assert "scripts/refresh-pr.sh" in refused and ".github/workflows/build.yml" in refused
    assert "locks/bases.json" not in refused
    mo.rows.append(
        f"| Dec 17 | refresh proposal touching scripts/ refused: {', '.join(refused)} | (all) | "
        "unchanged | unchanged | unchanged | the write job applies nothing |"
    )
    assert latest(ONE) == a8 and latest(MULTI) == b4

    # Dec 18: a dispatch of gpu.yml from a branch whose recipe is r9a: its run is not main's
    # head (and gpu.yml's promote job runs on main only): nothing moves
    a9 = mo.stage(ONE, "r9a")
    log = day(
        "Dec 18",
        "dispatch from branch feature/x (r9a)",
        run_sha="f18" + "0" * 37,
        records=[((ONE, a9, ok), {})],
        tags={ONE: "r9a", MULTI: "r4b"},
    )
    assert latest(ONE) == a8 and "NOTHING promoted" in log
    promote_if = yaml.safe_load((ROOT / ".github/workflows/gpu.yml").read_text())["jobs"]["promote"]["if"]
    assert "github.ref == 'refs/heads/main'" in promote_if

    # Dec 19-31: the nightly re-tests every published digest; everything passes, nothing moves
    before = {
        (repo, t, w): mo.point(repo, t, w)
        for repo in (ONE, MULTI)
        for t in ("latest", f"latest{ZSTD}")
        for w in (NS, "mirror")
    }
    for n in range(19, 32):
        gate = tmp_path / f"gate-nightly-{n}"
        gate.mkdir()
        mo.records(gate, ONE, a8, ok)
        mo.records(gate, MULTI, b4, ok2)
        log = mo.promote(gate, mo.head)
        mo.mirror(mirror_to)
        assert "->" not in log and {k: mo.point(*k) for k in before} == before
    mo.rows.append(
        "| Dec 19-31 | 13 nightly re-tests, every check passes | (all) | unchanged | unchanged | "
        "unchanged | every alias already current; mirror already current |"
    )

    # every alias the month left names a digest that is attested (key-signed, every platform)
    key = attest.att.load_public_key(mo.pub)
    client = attest.referrers.Client(registry.host)
    for repo, tag in ((ONE, "latest"), (ONE, f"latest{ZSTD}"), (MULTI, "latest")):
        for where in (NS, "mirror"):
            assert attest.attestation_problems(client, f"{where}/{repo}", mo.point(repo, tag, where), key) == [], (
                where,
                repo,
                tag,
            )

    table = [
        "# A month of delivery (tests/build/test_delivery_month.py)",
        "",
        (
            "Each row: where the tags of one repository point after the day's runs, and why (the promotion's "
            "and the mirror's own words). `month-openmpi` is one platform with a zstd twin; `month-torch` one "
            "index over linux/amd64 and linux/arm64."
        ),
        "",
        "| day | what happened | repository | `latest` | `latest-zstd` | mirror's `latest` | why |",
        "|---|---|---|---|---|---|---|",
        *mo.rows,
    ]
    out = ROOT / "reports" / "delivery-month.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(table) + "\n")
    print("\n".join(table))
