"""Which runners run what: no pull request's code on a self-hosted runner.

A pull request's workflow run executes the pull request's code -- its matrix.yaml, its
build.py, its Dockerfiles. On a GitHub-hosted runner that machine is thrown away after the job;
a self-hosted runner (the GPU hosts, the RDMA pool) is not, and holds what the next trusted job
uses (its Docker engine, its network, whatever credentials it can reach). Two rules keep the
two apart, both checked here:

1. The build runners come from the CI plan (``route``: matrix.yaml's ``platforms.*.runner``, or
   the repository variables TRAINBASE_BUILD_RUNNER / TRAINBASE_ARM64_RUNNER). For a pull
   request (GITHUB_EVENT_NAME ``pull_request`` or ``pull_request_target``) only a label of
   HOSTED_LABELS is used: a variable naming another runner is not applied to it, and a
   matrix.yaml naming one -- which the pull request itself can edit -- refuses the plan.
2. In the workflows (``pull_request_findings``, a unit test over .github/workflows): a job
   that can run on a runner outside HOSTED_LABELS -- a literal label, a runner group, or an
   expression (a matrix field, a variable) -- can never be started by a pull request event:
   its ``if:`` excludes both events, or no pull request reaches its workflow. The one
   expression allowed on such a path is the plan's own label, ``${{ matrix.cell.runs_on }}``
   over a matrix that `build.py --ci-matrix` wrote (rule 1 vetted it).

Neither rule binds a pull request that edits the workflows or this module themselves: those
run from the pull request too. What does is how the self-hosted runners are registered -- a
runner group that only the default branch's gpu.yml may use, ephemeral runners, approval for
outside contributors (docs/gpu-tier.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import TrainbaseError

# GitHub's standard hosted runner labels (a larger hosted runner has a name its owner chose,
# which a workflow cannot tell from a self-hosted one: pull requests do not get those either)
HOSTED_LABELS = frozenset(
    {
        "ubuntu-latest",
        "ubuntu-24.04",
        "ubuntu-22.04",
        "ubuntu-24.04-arm",
        "ubuntu-22.04-arm",
        "ubuntu-slim",
        "windows-latest",
        "windows-2025",
        "windows-2022",
        "windows-11-arm",
        "macos-latest",
        "macos-26",
        "macos-15",
        "macos-14",
        "macos-13",
        "macos-15-intel",
    }
)
PULL_REQUEST_EVENTS = ("pull_request", "pull_request_target")

BUILD_RUNNER = "TRAINBASE_BUILD_RUNNER"  # repository variable: the build runner of every cell but arm64 ones
ARM64_RUNNER = "TRAINBASE_ARM64_RUNNER"  # repository variable: the arm64 cells' (an x86_64 one builds under qemu)


class UntrustedRunner(TrainbaseError):
    """A pull request's plan names a runner that is not GitHub-hosted."""


def route(items: list[dict[str, Any]], env: Mapping[str, str]) -> list[str]:
    """Set each CI-matrix entry's ``runs_on`` to the runner build-cells.yml builds it on: the
    repository variable for its architecture (ARM64_RUNNER, else BUILD_RUNNER) when set, else
    matrix.yaml's runner for its platform. For a pull request (``env["GITHUB_EVENT_NAME"]``) a
    variable outside HOSTED_LABELS is not applied -- the platform's runner is used and a notice
    returned, one per variable --, and a platform runner outside them raises UntrustedRunner
    naming every such cell: nothing of the plan runs."""
    untrusted = env.get("GITHUB_EVENT_NAME", "") in PULL_REQUEST_EVENTS
    notes: dict[str, str] = {}
    refused: dict[tuple[str, str], list[str]] = {}  # (platform, its runner) -> the cells
    for e in items:
        var = ARM64_RUNNER if e["arch"] == "arm64" else BUILD_RUNNER
        label = env.get(var, "").strip()
        if label and untrusted and label not in HOSTED_LABELS:
            notes[var] = (
                f"{var}={label} is not a GitHub-hosted label, so a pull request does not build "
                "there: its cells build on matrix.yaml's platform runner (platforms.*.runner)"
            )
            label = ""
        if not label:
            label = e["runs_on"]
            if untrusted and label not in HOSTED_LABELS:
                refused.setdefault((e["platform"], label), []).append(e["name"])
        e["runs_on"] = label
    if refused:
        named = [
            f"platforms.{plat}.runner is {label} ({len(cells)} cell(s): {', '.join(cells[:3])}"
            f"{', ...' if len(cells) > 3 else ''})"
            for (plat, label), cells in refused.items()
        ]
        raise UntrustedRunner(
            f"a pull request builds on GitHub-hosted runners only ({', '.join(sorted(HOSTED_LABELS))}), and "
            f"matrix.yaml's {'; '.join(named)}: its code would run on a machine that outlives the job "
            "(docs/gpu-tier.md)"
        )
    return list(notes.values())


# -- the workflows ------------------------------------------------------------------------------
PLAN_LABEL = re.compile(r"\$\{\{\s*matrix\.cell\.runs_on\s*\}\}")
# the plan step: `build.py ci-matrix` (or its old spelling, `build.py --ci-matrix`)
CI_MATRIX = re.compile(r"build\.py\s+(?:--)?ci-matrix(?![\w-])")
FROM_JSON = re.compile(r"\$\{\{\s*fromJSON\(\s*(needs\.([\w-]+)\.outputs\.[\w-]+|inputs\.([\w-]+))\s*\)\s*\}\}")
NEEDS_OUTPUT = re.compile(r"\$\{\{\s*needs\.([\w-]+)\.outputs\.[\w-]+\s*\}\}")


def events(doc: dict[Any, Any]) -> set[str]:
    """The events that start a workflow (YAML 1.1 reads the key ``on`` as True)."""
    on = doc.get("on", doc.get(True)) or {}
    return {on} if isinstance(on, str) else set(on)


def excludes_pull_requests(condition: object) -> bool:
    """Whether a job's ``if:`` is false for every pull request event: one of its top-level
    ``&&`` terms is ``!startsWith(github.event_name, 'pull_request')``, or two are
    ``github.event_name != 'pull_request'`` and ``... != 'pull_request_target'``. Any ``||``
    reads as not excluding (an alternative could let a pull request through)."""
    text = " ".join(str(condition or "").split())
    text = text.removeprefix("${{").removesuffix("}}").strip()
    if not text or "||" in text:
        return False
    terms = {t.strip() for t in text.split("&&")}
    return "!startsWith(github.event_name, 'pull_request')" in terms or all(
        f"github.event_name != '{e}'" in terms for e in PULL_REQUEST_EVENTS
    )


def _jobs(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return doc.get("jobs") or {}


def _callers(workflows: dict[str, dict[str, Any]], path: str) -> list[tuple[str, dict[str, Any]]]:
    """(caller workflow, job) of each job that calls ``path`` (``uses: ./PATH``)."""
    return [
        (p, job)
        for p, doc in workflows.items()
        for job in _jobs(doc).values()
        if str(job.get("uses", "")).removeprefix("./") == path
    ]


def reached_by_pull_requests(workflows: dict[str, dict[str, Any]]) -> set[str]:
    """The workflows a pull request event starts: on its own, or called (``uses: ./...``) by a
    job of one it starts whose ``if:`` does not exclude pull requests."""
    reached = {p for p, doc in workflows.items() if events(doc) & set(PULL_REQUEST_EVENTS)}
    grew = True
    while grew:
        grew = False
        for p in sorted(reached):
            for job in _jobs(workflows[p]).values():
                called = str(job.get("uses", "")).removeprefix("./")
                if called in workflows and called not in reached and not excludes_pull_requests(job.get("if")):
                    reached.add(called)
                    grew = True
    return reached


def _runs_ci_matrix(doc: dict[str, Any], job_name: str) -> bool:
    steps = (_jobs(doc).get(job_name) or {}).get("steps") or []
    return any(CI_MATRIX.search(str(s.get("run", ""))) for s in steps)


def _plan_matrix(workflows: dict[str, dict[str, Any]], path: str, job: dict[str, Any]) -> bool:
    """Whether the job's ``matrix.cell`` is what `build.py --ci-matrix` printed: fromJSON of a
    plan job's output, or of an input every caller fills with one."""
    source = FROM_JSON.fullmatch(str(((job.get("strategy") or {}).get("matrix") or {}).get("cell", "")).strip())
    if not source:
        return False
    if source.group(2):
        return _runs_ci_matrix(workflows[path], source.group(2))
    callers = _callers(workflows, path)
    passed = [
        (p, NEEDS_OUTPUT.fullmatch(str((j.get("with") or {}).get(source.group(3), "")).strip())) for p, j in callers
    ]
    return bool(callers) and all(m is not None and _runs_ci_matrix(workflows[p], m.group(1)) for p, m in passed)


def self_hosted(workflows: dict[str, dict[str, Any]], path: str, job: dict[str, Any]) -> str | None:
    """Why the job can run on a runner outside HOSTED_LABELS; None when it cannot (or calls a
    workflow, whose own jobs say where they run)."""
    runs_on = job.get("runs-on")
    if runs_on is None:
        return None
    if isinstance(runs_on, dict):
        if runs_on.get("group"):
            return f"runner group {runs_on['group']!r} (self-hosted or larger runners)"
        runs_on = runs_on.get("labels") or []
    labels = [str(x) for x in (runs_on if isinstance(runs_on, list) else [runs_on])]
    if len(labels) == 1 and PLAN_LABEL.fullmatch(labels[0].strip()) and _plan_matrix(workflows, path, job):
        return None  # the plan's label: hosted only for pull requests (route)
    foreign = [x for x in labels if "${{" not in x and x not in HOSTED_LABELS]
    if foreign:
        return f"runs-on {labels}: {', '.join(foreign)} is no GitHub-hosted label"
    if any("${{" in x for x in labels):
        return f"runs-on {labels} is an expression, which may name any runner"
    return None


def pull_request_findings(workflows: dict[str, dict[str, Any]]) -> list[str]:
    """Each job that can run on a runner outside HOSTED_LABELS and that a pull request event
    can start (its workflow is reached by one, and its ``if:`` does not exclude them)."""
    reached = reached_by_pull_requests(workflows)
    found = []
    for path in sorted(reached):
        for name, job in _jobs(workflows[path]).items():
            why = self_hosted(workflows, path, job)
            if why and not excludes_pull_requests(job.get("if")):
                found.append(
                    f"{path}: job {name}: {why}, and a pull request can start it (exclude "
                    "pull_request and pull_request_target in its if:, or run it on the plan's "
                    "${{ matrix.cell.runs_on }})"
                )
    return found


def unguarded(workflows: dict[str, dict[str, Any]]) -> list[str]:
    """Each job that can run on a runner outside HOSTED_LABELS whose ``if:`` does not exclude
    pull requests, whether or not one reaches it today: a trigger added later, or a call from
    ci.yml, must not be what puts a pull request's code on a GPU host."""
    return [
        f"{path}: job {name}: {why}"
        for path, doc in sorted(workflows.items())
        for name, job in _jobs(doc).items()
        if (why := self_hosted(workflows, path, job)) and not excludes_pull_requests(job.get("if"))
    ]
