"""A second week of delivery, driven through the commands the workflows run, on real cells of
matrix.yaml (a scratch git checkout of the repository) and the loopback registry:

- build.yml's plan (`build.py --ci-matrix --only unpublished`) over a multi-arch repository
  (Debian, amd64 + arm64) and one whose arm64 twin is refused (Ubuntu: the scratch checkout sets
  Miniforge's aarch64 checksum back to pending, as it was until 2e267c3, so the build refuses
  that platform);
- each platform runner's stage step (publish.publish, what `--push stage` calls; the images are
  tiny FROM-scratch stand-ins pushed under the cells' real recipe tags, with a signed SBOM and
  provenance attached);
- merge-platforms (`build.py --merge-platforms`);
- gpu.yml's plan of what to test (`--ci-matrix --only unpromoted`), with the GPU tier's and the
  scan's records injected for exactly the refs it prints (no GPU runner, one amd64 runner,
  both runners, a failure);
- a fork's pull request that routes the build to the GPU host (its plan refuses to run);
- promotion (`build.py --promote --gate`) and the mirror (`python -m trainbase.deliver.mirror`);
- the weekly refresh: the security job's artifact (a rebuild epoch for the Debian row) taken by
  the propose job's steps (`--render`, `--affected HEAD`, the patch) and applied by the
  pull-request job's `git apply` onto main, merged;
- and a revert of that merge.

After each day the test asserts what `latest` points to for both repositories, in the primary
and in the mirror, and writes the table to reports/delivery-refresh-week.md."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainbase.deliver import attest, promote, publish
from trainbase.supply import vulnscan
from trainbase_common.states import JobState

from ..conftest import ROOT, copy_inputs, pend_miniforge_arm64
from .test_registry_side import _keypair

pytestmark = pytest.mark.engine
NS, MIRROR_NS = "trainbase", "mirror"
MULTI = "openmpi5.0.11-cuda13.0-cudnn9-debian12"  # amd64 + arm64: one index
SINGLE = "openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"  # its arm64 twin is refused (pend_miniforge_arm64)
CELLS = [MULTI, f"{MULTI}-arm64", SINGLE, f"{SINGLE}-arm64"]
SELECT = [arg for name in CELLS for arg in ("--select", f"name={name}")]


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=week", "-c", "user.email=week@example.invalid", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, f"git {' '.join(args)}: {r.stderr}"
    return r.stdout


def _remove_stand_ins(docker: str) -> None:
    """The stand-in images' local tags (week/...): bytes only, but no debris in the engine."""
    refs = subprocess.run(
        [docker, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "week/*"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.split()
    if refs:
        subprocess.run([docker, "image", "rm", *refs], capture_output=True, timeout=120, check=False)


class Week:
    def __init__(self, main: Path, registry, docker: str, key: Path, tmp: Path):
        self.main, self.registry, self.docker, self.key, self.tmp = main, registry, docker, key, tmp
        self.primary = f"{registry.host}/{NS}"
        self.mirror = f"{registry.host}/{MIRROR_NS}"

    def run(
        self,
        *args: str,
        module: str | None = None,
        ok: tuple[int, ...] = (0,),
        event: str = "push",
        env: dict[str, str] | None = None,
    ) -> str:
        cmd = [sys.executable, "-m", module] if module else [sys.executable, str(ROOT / "build.py")]
        r = subprocess.run(
            [*cmd, *args, "--file", str(self.main / "matrix.yaml")],
            cwd=self.main,
            capture_output=True,
            text=True,
            timeout=600,
            env={**self.registry.env(), "PYTHONPATH": str(ROOT), "GITHUB_EVENT_NAME": event, **(env or {})},
            check=False,
        )
        assert r.returncode in ok, f"{' '.join(args)}: exit {r.returncode}\n{r.stdout[-2500:]}\n{r.stderr[-2500:]}"
        return r.stdout + r.stderr

    def plan(self, only: str) -> tuple[list[dict], dict[str, str]]:
        """build.yml's (unpublished) or gpu.yml's (unpromoted) plan: its entries and left_out."""
        out = self.run("--ci-matrix", *SELECT, "--registry", self.primary, "--only", only)
        lines = dict(ln.split("=", 1) for ln in out.splitlines() if ln.startswith(("cells=", "left_out=")))
        return json.loads(lines["cells"]), json.loads(lines["left_out"])

    def stage(self, entries: list[dict]) -> str:
        """Each platform runner's publish step for its entries (``--push stage``): stand-in images
        under the cells' recipe tags, with their signed SBOM and provenance."""
        from trainbase.define.matrix import load
        from trainbase.deliver import platforms

        expected = platforms.expected(load(self.main / "matrix.yaml"), self.main)
        log = io.StringIO()
        for platform in sorted({e["platform"] for e in entries}):
            jobs = []
            for e in (e for e in entries if e["platform"] == platform):
                image = f"week/{e['name']}:{e['tag']}"  # never the engine's real image of the cell
                ctx = self.tmp / "ctx" / e["name"] / e["tag"]
                ctx.mkdir(parents=True)
                (ctx / "recipe").write_text(f"{e['name']} {e['tag']}\n")
                (ctx / "Dockerfile").write_text("FROM scratch\nCOPY recipe /recipe\n")
                self._docker("build", "--platform", platform, "-t", image, str(ctx))
                docs = self.tmp / "supply" / e["name"] / e["tag"]
                docs.mkdir(parents=True, exist_ok=True)
                (docs / "sbom.cdx.json").write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6"}))
                (docs / "inputs.lock.json").write_text(json.dumps({"tag": e["tag"], "inputs": {}}))
                jobs.append(
                    SimpleNamespace(
                        name=e["name"],
                        repository=e["repository"],
                        platform=platform,
                        image=image,
                        tag=e["tag"],
                        parent=None,
                        status=JobState.BUILT,
                        pushed=[],
                        present=[],
                        repo_digest=None,
                    )
                )
            attester = attest.Attester(self.primary, self.tmp / "supply", self.key, io.StringIO())
            publish.publish(
                jobs,
                self.primary,
                lambda src, dst: self._docker("tag", src, dst),
                log,
                platforms=expected,
                attest=attester.attach,
            )
        return log.getvalue()

    def _docker(self, *args: str) -> None:
        r = subprocess.run(
            [self.docker, "--config", str(self.registry.config), *args],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
            check=False,
        )
        assert r.returncode == 0, r.stderr[-1500:]

    def gate(self, day: str, refs: list[dict], gpu: dict[str, bool | None], scan: bool = True) -> Path:
        """gpu.yml's records for the refs its plan printed: per platform, True/False, or None for
        a GPU job that never ran (no runner with that label: nothing written)."""
        d = self.tmp / f"gate-{day}"
        d.mkdir()
        for i, e in enumerate(refs):
            # one GPU job per cell, on its platform's runners; one scan per cell
            if gpu.get(e["platform"]) is not None:
                (d / f"gpu-{i}.json").write_text(
                    json.dumps(
                        {
                            "ref": e["ref"],
                            "check": promote.GPU_TIER,
                            "platform": e["platform"],
                            "passed": gpu[e["platform"]],
                        }
                    )
                )
            (d / f"scan-{i}.json").write_text(
                json.dumps({"ref": e["ref"], "check": vulnscan.CHECK, "platform": e["platform"], "passed": scan})
            )
        return d

    def latest(self, ns: str, repo: str) -> str | None:
        return self.registry.digest(f"{ns}/{repo}", "latest")


@pytest.mark.slow
def test_a_week_of_a_multi_arch_repository_through_plan_merge_gate_refresh_and_revert(
    registry, docker, monkeypatch, tmp_path, request
):
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    request.addfinalizer(lambda: _remove_stand_ins(docker))
    (tmp_path / "main").mkdir()
    main = copy_inputs(tmp_path / "main")
    key, pub = _keypair(tmp_path, "refresh-week")
    w = Week(main, registry, docker, key, tmp_path)
    pend_miniforge_arm64(main / "matrix.yaml")
    w.run("--render")  # images/ as the edited matrix renders it, so only the week's changes show
    _git(main, "init", "-q", "-b", "main")
    _git(main, "add", "-A")
    _git(main, "commit", "-q", "-m", "main")
    table, names = [], {}

    def day(
        label: str,
        what: str,
        gpu: dict[str, bool | None],
        want: dict[str, str | None],
        promote_exit: int,
        held: str = "",
    ) -> dict[str, list[dict]]:
        """One push to main: build.yml's plan, stage, merge; gpu.yml's plan, records, promote, mirror."""
        todo, left_out = w.plan("unpublished")
        assert f"{SINGLE}-arm64" in left_out and "miniforge" in left_out[f"{SINGLE}-arm64"], left_out
        assert all(e["name"] != f"{SINGLE}-arm64" for e in todo), "the plan builds a refused platform"
        staged = w.stage(todo)
        merged = w.run("--merge-platforms", *SELECT, "--registry", w.primary)
        assert "repository(ies) missing a platform" in merged and ", 0 repository" in merged, merged
        assert f"{SINGLE}: left out, never built" in merged, merged
        tested, _ = w.plan("unpromoted")
        gate = w.gate(label, tested, gpu)
        promoted = w.run(
            "--promote",
            *SELECT,
            "--registry",
            w.primary,
            "--gate",
            str(gate),
            "--public-key",
            str(pub),
            ok=(promote_exit,),
        )
        if held:
            assert held in promoted and "HELD:" in promoted, f"{label}: {promoted}"
        mirrored = w.run("--from", w.primary, "--to", w.mirror, *SELECT, module="trainbase.deliver.mirror")
        row = {}
        for repo, expect in want.items():
            got, in_mirror = w.latest(NS, repo), w.latest(MIRROR_NS, repo)
            assert got == expect, f"{label}: {repo}:latest is {got}, expected {expect}\n{promoted}"
            assert in_mirror == got, (
                f"{label}: the mirror's {repo}:latest is {in_mirror}, the primary's {got}\n{mirrored}"
            )
            said = io.StringIO()
            assert (
                not got
                or attest.verify_command(None, tmp_path, [], f"{w.primary}/{repo}:latest", None, str(pub), out=said)
                == 0
            ), f"{label}: {repo}:latest is unattested: {said.getvalue()}"
            if got:
                said = io.StringIO()
                assert (
                    attest.verify_command(None, tmp_path, [], f"{w.mirror}/{repo}:latest", None, str(pub), out=said)
                    == 0
                ), f"{label}: the mirror's {repo}:latest is unattested: {said.getvalue()}\n{mirrored}"
            row[repo] = names.get(got, "absent")
        table.append(
            (
                label,
                what,
                len(todo),
                len(tested),
                row[MULTI],
                row[SINGLE],
                promoted.strip().splitlines()[-1 if not held else -2],
            )
        )
        return {"todo": todo, "tested": tested, "staged": [staged]}

    def release(entries: list[dict], repo: str) -> tuple[str, str]:
        tag = next(e["release_tag"] for e in entries if e["repository"] == repo)
        digest = registry.digest(f"{NS}/{repo}", tag)
        names[digest] = f"{tag} ({digest[:19]})"
        return tag, digest

    # Mon: hosted runners only -- everything is built, staged, merged and scanned; no GPU job runs
    mon = day(
        "Mon",
        "hosted runners only: built, merged, scanned; no GPU runner",
        {},
        {MULTI: None, SINGLE: None},
        1,
        held="missing gpu[linux/amd64], gpu[linux/arm64]",
    )
    assert len(mon["todo"]) == 3 and len(mon["tested"]) == 3, mon
    (t_multi, d_multi), (_t_single, d_single) = release(mon["todo"], MULTI), release(mon["todo"], SINGLE)
    # Tue: one amd64 GPU runner online: the Ubuntu repository passes and moves on its own
    # verdict; the Debian index still lacks its arm64 GPU tier, and is held alone (issue 52)
    tue = day(
        "Tue",
        "an amd64 GPU runner registered; no arm64 one",
        {"linux/amd64": True},
        {MULTI: None, SINGLE: d_single},
        1,
        held="missing gpu[linux/arm64]",
    )
    assert not tue["todo"], f"Tuesday rebuilt what Monday published: {tue['todo']}"
    # ... and a fork's pull request that points the amd64 build runner at the GPU host: its plan
    # (the pull request's own matrix.yaml, build.py's routing) refuses to run there; the same
    # label as a repository variable is not applied to a pull request either
    fork = tmp_path / "fork"
    _git(tmp_path, "clone", "-q", str(main), str(fork))
    planted = (fork / "matrix.yaml").read_text().replace("runner: ubuntu-24.04\n", "runner: gpu\n", 1)
    assert planted != (fork / "matrix.yaml").read_text()
    (fork / "matrix.yaml").write_text(planted)
    w.main = fork
    refused = w.run("--ci-matrix", *SELECT, event="pull_request", ok=(1,))
    assert "a pull request builds on GitHub-hosted runners only" in refused and "runner is gpu" in refused, refused
    w.main = main
    routed = w.run("--ci-matrix", *SELECT, event="pull_request", env={"TRAINBASE_BUILD_RUNNER": "gpu"})
    assert "TRAINBASE_BUILD_RUNNER=gpu is not a GitHub-hosted label" in routed and '"runs_on":"gpu"' not in routed, (
        routed
    )
    assert w.latest(NS, MULTI) is None and w.latest(NS, SINGLE) == d_single, "a pull request moved an alias"
    # Wed: the arm64 GPU runner too: both repositories promoted and mirrored
    day(
        "Wed",
        "both GPU runners pass both repositories",
        {"linux/amd64": True, "linux/arm64": True},
        {MULTI: d_multi, SINGLE: d_single},
        0,
    )

    # Thu: the weekly refresh. The security job found a pending Debian fix (its artifact:
    # locks/security-rebuilds.json); propose renders, lists the affected cells and makes the patch
    proposal = tmp_path / "propose"
    _git(tmp_path, "clone", "-q", str(main), str(proposal))
    (proposal / "locks" / "security-rebuilds.json").write_text(
        json.dumps({"schema": 1, "os": {"debian12": {"epoch": "2026-11-26", "fixes": ["openssl 3.0.17-1~deb12u3"]}}})
    )
    w.main = proposal
    w.run("--render")
    affected = w.run("--affected", "HEAD")
    assert MULTI in affected and SINGLE not in affected, affected
    _git(proposal, "add", "--all", "--", "locks", "images", "matrix.yaml")
    patch = _git(proposal, "diff", "--cached", "--binary")
    assert "TRAINBASE_SECURITY_REBUILD=2026-11-26" in patch, patch[:2000]
    # the pull-request job applies it (it runs no build.py); the pull request is merged into main
    w.main = main
    (tmp_path / "refresh.patch").write_text(patch)
    _git(main, "apply", "--binary", str(tmp_path / "refresh.patch"))
    _git(main, "add", "-A")
    _git(main, "commit", "-q", "-m", "weekly refresh")
    thu = day(
        "Thu",
        "the refresh merged (Debian security epoch); arm64 GPU tier fails the new index",
        {"linux/amd64": True, "linux/arm64": False},
        {MULTI: d_multi, SINGLE: d_single},
        1,
        held="failed gpu[linux/arm64]",
    )
    assert {e["name"] for e in thu["todo"]} == {MULTI, f"{MULTI}-arm64"}, thu["todo"]
    t_refresh, d_refresh = release(thu["todo"], MULTI)
    assert t_refresh != t_multi and d_refresh != d_multi
    # Fri: the GPU tier re-run on the refreshed index passes: latest moves to it, the mirror follows
    day(
        "Fri",
        "the re-run of the GPU tier passes the refreshed index",
        {"linux/amd64": True, "linux/arm64": True},
        {MULTI: d_refresh, SINGLE: d_single},
        0,
    )
    # Sat: the refresh is reverted; nothing is rebuilt, Wednesday's index is re-tested and latest follows it back
    _git(main, "revert", "--no-edit", "HEAD")
    sat = day(
        "Sat",
        "the refresh reverted: Wednesday's index re-tested, latest back on it",
        {"linux/amd64": True, "linux/arm64": True},
        {MULTI: d_multi, SINGLE: d_single},
        0,
    )
    assert not sat["todo"] and [e["repository"] for e in sat["tested"]] == [MULTI] * 2, sat

    head = [
        f"| day | what happened | cells built | refs GPU-tested | `{MULTI}:latest` | `{SINGLE}:latest` | promotion |",
        "|---|---|---|---|---|---|---|",
    ]
    lines = head + [f"| {d} | {w_} | {n} | {t} | {a} | {b} | {p} |" for d, w_, n, t, a, b, p in table]
    out = ROOT / "reports" / "delivery-refresh-week.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
