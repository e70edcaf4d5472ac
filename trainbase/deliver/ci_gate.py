"""Publishing waits for CI: has ci.yml passed on this commit?

build.yml publishes a commit only after ci.yml's checks (unit tests, render drift, hadolint)
passed on that same commit. Started by ci.yml's completion (`workflow_run`) the answer is in
the event already; a manual dispatch has none, so its first job asks GitHub for ci.yml's runs
of the commit (`gh api .../actions/workflows/ci.yml/runs?head_sha=SHA`) and goes on only when
the latest completed push run succeeded. Both paths run this check (one rule, one place).

    python -m trainbase.deliver.ci_gate --repo OWNER/NAME --workflow ci.yml --sha SHA
        prints `sha=SHA` (for $GITHUB_OUTPUT) and exits 0 when it passed; otherwise exits 1,
        saying which run failed, is still running, or that none ran

Standard library only (the runner's python3, nothing installed); `gh` reads GH_TOKEN.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str


def verdict(runs: list[dict[str, Any]], sha: str, workflow: str = "ci.yml") -> Verdict:
    """ci.yml's verdict on ``sha`` from its workflow runs (the REST API's `workflow_runs`): the
    most recent push run of that commit decides (a re-run that passed after a flaky failure
    counts; a later failure does not pass)."""
    mine = [r for r in runs if r.get("head_sha") == sha and r.get("event") == "push"]
    if not mine:
        return Verdict(False, f"{workflow} has no push run for {sha}: publish only a commit CI has checked")
    latest = max(mine, key=lambda r: (r.get("run_number", 0), r.get("run_attempt", 0), r.get("updated_at", "")))
    where = latest.get("html_url", f"run {latest.get('id')}")
    if latest.get("status") != "completed":
        return Verdict(False, f"{workflow} on {sha} is still {latest.get('status')} ({where}): publish after it passed")
    if latest.get("conclusion") != "success":
        return Verdict(
            False, f"{workflow} on {sha} concluded {latest.get('conclusion')} ({where}): nothing is published"
        )
    return Verdict(True, f"{workflow} passed on {sha} ({where})")


def fetch_runs(repo: str, workflow: str, sha: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [
            "gh",
            "api",
            "-X",
            "GET",
            f"repos/{repo}/actions/workflows/{workflow}/runs",
            "-f",
            f"head_sha={sha}",
            "-f",
            "event=push",
            "-f",
            "per_page=100",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"gh api could not list {workflow}'s runs: {proc.stderr.strip()}")
    return list(json.loads(proc.stdout).get("workflow_runs", []))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainbase.deliver.ci_gate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="OWNER/NAME")
    ap.add_argument("--workflow", default="ci.yml")
    ap.add_argument("--sha", required=True)
    args = ap.parse_args(argv)
    try:
        runs = fetch_runs(args.repo, args.workflow, args.sha)
    except (RuntimeError, json.JSONDecodeError) as e:
        print(f"::error::{e}", file=sys.stderr)
        return 1
    v = verdict(runs, args.sha, args.workflow)
    if not v.passed:
        print(f"::error::{v.reason}", file=sys.stderr)
        return 1
    print(v.reason, file=sys.stderr)
    print(f"sha={args.sha}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
