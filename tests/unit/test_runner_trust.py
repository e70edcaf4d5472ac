"""No pull request's code on a self-hosted runner, and no job waiting on a runner no one has
(trainbase/deliver/runners.py).

- The CI plan routes a pull request's cells to GitHub-hosted labels only: matrix.yaml's
  ``platforms.*.runner``, which the pull request itself can edit, naming another fails the plan;
  a repository variable naming another is not applied to it.
- Over .github/workflows: no job that can run on a runner outside the hosted labels (a literal
  label, a runner group, an expression) can be started by a pull request event; every
  self-hosted job excludes them in its ``if:`` and has a timeout-minutes; the RDMA pool's job
  runs only where TRAINBASE_RDMA_RUNNERS says the pool exists, and a notice says when it did not.
The checker is shown failing on planted workflows."""

import json
import textwrap

import pytest
import yaml

from trainbase.deliver import runners

from .conftest import ROOT, run_cli

WORKFLOWS = ROOT / ".github" / "workflows"


def repository_workflows() -> dict[str, dict]:
    return {str(p.relative_to(ROOT)): yaml.safe_load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.yml"))}


def planted(tmp_path, files: dict[str, str]) -> dict[str, dict]:
    """Workflow texts written to a scratch .github/workflows and read back as the checker reads them."""
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return {str(p.relative_to(tmp_path)): yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yml"))}


# -- the plan --------------------------------------------------------------------------------------
def ci_matrix(capsys, monkeypatch, matrix_file, event: str, **variables) -> tuple[int, dict, str]:
    monkeypatch.setenv("GITHUB_EVENT_NAME", event)
    for var in (runners.BUILD_RUNNER, runners.ARM64_RUNNER):
        monkeypatch.delenv(var, raising=False)
    for var, value in variables.items():
        monkeypatch.setenv(var, value)
    code, out, err = run_cli(["ci-matrix", "--file", str(matrix_file), "--profile", "local"], capsys)
    cells = json.loads(next(ln for ln in out.splitlines() if ln.startswith("cells="))[6:]) if code == 0 else []
    return code, {c["name"]: c["runs_on"] for c in cells}, err


def self_hosted_matrix(workdir) -> object:
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    data["platforms"]["linux/amd64"]["runner"] = "gpu"  # what a pull request could write
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return workdir / "matrix.yaml"


@pytest.mark.parametrize("event", runners.PULL_REQUEST_EVENTS)
def test_a_pull_requests_plan_naming_a_self_hosted_runner_is_refused(workdir, capsys, monkeypatch, event):
    """The old plan printed it and build-cells.yml ran the pull request's build on `gpu`."""
    matrix_file = self_hosted_matrix(workdir)
    code, _, err = ci_matrix(capsys, monkeypatch, matrix_file, event)
    assert code == 1 and "a pull request builds on GitHub-hosted runners only" in err
    assert "matrix.yaml's platforms.linux/amd64.runner is gpu (" in err
    code, routed, _ = ci_matrix(capsys, monkeypatch, matrix_file, "push")  # main's own matrix.yaml: its choice
    assert code == 0 and set(routed.values()) >= {"gpu"}


def test_the_repository_matrix_routes_pull_requests_to_hosted_runners(capsys, monkeypatch):
    code, routed, _ = ci_matrix(capsys, monkeypatch, ROOT / "matrix.yaml", "pull_request")
    assert code == 0 and routed and set(routed.values()) <= runners.HOSTED_LABELS


def test_a_runner_variable_applies_to_pull_requests_only_when_it_names_a_hosted_label(capsys, monkeypatch):
    code, routed, err = ci_matrix(
        capsys,
        monkeypatch,
        ROOT / "matrix.yaml",
        "pull_request",
        TRAINBASE_BUILD_RUNNER="gpu-build-box",
        TRAINBASE_ARM64_RUNNER="ubuntu-24.04",
    )
    assert code == 0
    assert {routed[n] for n in routed if not n.endswith("-arm64")} == {"ubuntu-24.04"}  # matrix.yaml's
    assert {routed[n] for n in routed if n.endswith("-arm64")} == {"ubuntu-24.04"}  # qemu on x86_64: hosted
    assert "::warning::TRAINBASE_BUILD_RUNNER=gpu-build-box is not a GitHub-hosted label" in err
    code, routed, err = ci_matrix(
        capsys, monkeypatch, ROOT / "matrix.yaml", "push", TRAINBASE_BUILD_RUNNER="gpu-build-box"
    )
    assert code == 0 and {routed[n] for n in routed if not n.endswith("-arm64")} == {"gpu-build-box"}
    assert "::warning::" not in err


def test_build_cells_runs_on_the_plans_label_and_the_plans_pass_the_variables():
    cell = yaml.safe_load((WORKFLOWS / "build-cells.yml").read_text())["jobs"]["cell"]
    assert cell["runs-on"] == "${{ matrix.cell.runs_on }}"
    for name in ("ci.yml", "build.yml"):
        plan = yaml.safe_load((WORKFLOWS / name).read_text())["jobs"]["plan"]
        step = next(s for s in plan["steps"] if "build.py ci-matrix" in s.get("run", ""))
        for var in (runners.BUILD_RUNNER, runners.ARM64_RUNNER):
            assert step["env"][var] == f"${{{{ vars.{var} }}}}", (name, var)


# -- the workflows ---------------------------------------------------------------------------------
def test_no_pull_request_reaches_a_self_hosted_job():
    assert runners.pull_request_findings(repository_workflows()) == []


def test_every_self_hosted_job_excludes_pull_requests_in_its_if():
    workflows = repository_workflows()
    assert runners.unguarded(workflows) == []
    hosted_elsewhere = [
        (p, n) for p, doc in workflows.items() for n, j in doc["jobs"].items() if runners.self_hosted(workflows, p, j)
    ]
    assert (".github/workflows/gpu.yml", "gpu") in hosted_elsewhere  # the checker sees them
    assert (".github/workflows/gpu.yml", "multinode-fabric") in hosted_elsewhere
    assert ".github/workflows/build-cells.yml" in runners.reached_by_pull_requests(workflows)


PR_CALLER = """\
    name: ci
    on:
      pull_request:
    jobs:
      plan:
        runs-on: ubuntu-24.04
        steps:
          - id: plan
            run: python build.py --ci-matrix --since "$BASE" | tee -a "$GITHUB_OUTPUT"
      cells:
        needs: plan
        uses: ./.github/workflows/cells.yml
        with:
          cells: ${{ needs.plan.outputs.cells }}
    """


def cells_workflow(runs_on: str, cell_source: str = "${{ fromJSON(inputs.cells) }}") -> str:
    return f"""\
    name: cells
    on:
      workflow_call:
        inputs:
          cells:
            type: string
    jobs:
      cell:
        runs-on: {runs_on}
        strategy:
          matrix:
            cell: {cell_source}
        steps:
          - run: echo build
    """


@pytest.mark.parametrize(
    ("runs_on", "why"),
    [
        ("[self-hosted, gpu]", "gpu is no GitHub-hosted label"),
        ("my-build-box", "my-build-box is no GitHub-hosted label"),
        ('"${{ vars.TRAINBASE_BUILD_RUNNER || matrix.cell.runs_on }}"', "is an expression, which may name any runner"),
        ('"${{ matrix.cell.gpu_label }}"', "is an expression"),
        ("{group: gpu-pool}", "runner group 'gpu-pool'"),
    ],
)
def test_the_checker_reports_a_planted_self_hosted_job_a_pull_request_reaches(tmp_path, runs_on, why):
    workflows = planted(tmp_path, {"ci.yml": PR_CALLER, "cells.yml": cells_workflow(runs_on)})
    [found] = runners.pull_request_findings(workflows)
    assert found.startswith(".github/workflows/cells.yml: job cell: ") and why in found
    assert "a pull request can start it" in found


def test_the_checker_reports_a_self_hosted_job_in_a_pull_request_workflow_itself(tmp_path):
    workflows = planted(
        tmp_path,
        {
            "pr.yml": """\
        on: [pull_request_target]
        jobs:
          test:
            runs-on: [self-hosted, gpu]
            if: github.event_name != 'pull_request'
            steps:
              - run: echo test
        """
        },
    )
    [found] = runners.pull_request_findings(workflows)
    assert found.startswith(".github/workflows/pr.yml: job test: ")


def test_the_plans_label_passes_and_a_guard_or_an_unreached_workflow_passes(tmp_path):
    plan_label = planted(
        tmp_path / "a", {"ci.yml": PR_CALLER, "cells.yml": cells_workflow('"${{ matrix.cell.runs_on }}"')}
    )
    assert runners.pull_request_findings(plan_label) == []
    # the same label over a matrix no plan wrote is any runner
    made_up = planted(
        tmp_path / "b",
        {
            "ci.yml": PR_CALLER.replace("build.py --ci-matrix", "bash make-cells.sh"),
            "cells.yml": cells_workflow('"${{ matrix.cell.runs_on }}"'),
        },
    )
    assert len(runners.pull_request_findings(made_up)) == 1
    guarded = planted(
        tmp_path / "c",
        {
            "ci.yml": PR_CALLER.replace(
                "        uses:",
                "        if: github.event_name != 'pull_request' && github.event_name != 'pull_request_target'\n"
                "        uses:",
            ),
            "cells.yml": cells_workflow("[self-hosted, gpu]"),
        },
    )
    assert runners.pull_request_findings(guarded) == []
    assert len(runners.unguarded(guarded)) == 1  # yet the job itself carries no guard
    loose_guard = planted(
        tmp_path / "d",
        {
            "ci.yml": PR_CALLER.replace(
                "        uses:",
                "        if: github.event_name != 'pull_request' || github.ref == 'refs/heads/main'\n        uses:",
            ),
            "cells.yml": cells_workflow("[self-hosted, gpu]"),
        },
    )
    assert len(runners.pull_request_findings(loose_guard)) == 1


@pytest.mark.parametrize(
    ("condition", "excludes"),
    [
        ("github.event_name != 'pull_request' && github.event_name != 'pull_request_target'", True),
        ("${{ needs.plan.outputs.count != '0' && !startsWith(github.event_name, 'pull_request') }}", True),
        ("github.event_name != 'pull_request'", False),  # pull_request_target still runs it
        ("github.ref == 'refs/heads/main'", False),  # pull_request_target's ref is main
        ("github.event_name != 'pull_request' && github.event_name != 'pull_request_target' || always()", False),
        (None, False),
    ],
)
def test_what_counts_as_excluding_pull_requests(condition, excludes):
    assert runners.excludes_pull_requests(condition) is excludes


# -- nothing waits on a runner no one has ----------------------------------------------------------
def test_every_self_hosted_job_has_a_timeout():
    workflows = repository_workflows()
    jobs = [
        (p, n, j)
        for p, doc in workflows.items()
        for n, j in doc["jobs"].items()
        if runners.self_hosted(workflows, p, j)
    ]
    assert jobs
    assert [(p, n) for p, n, j in jobs if not isinstance(j.get("timeout-minutes"), int)] == []


def test_the_rdma_pools_job_runs_only_where_the_pool_is_declared_and_says_so_otherwise():
    jobs = yaml.safe_load((WORKFLOWS / "gpu.yml").read_text())["jobs"]
    rdma = {n: j for n, j in jobs.items() if "rdma" in (j.get("runs-on") or [])}
    assert list(rdma) == ["multinode-fabric"]
    for job in rdma.values():
        assert "vars.TRAINBASE_RDMA_RUNNERS == 'true'" in job["if"] and "||" not in job["if"]
    notice = [j for j in jobs.values() if "vars.TRAINBASE_RDMA_RUNNERS != 'true'" in str(j.get("if", ""))]
    assert len(notice) == 1 and notice[0]["runs-on"] in runners.HOSTED_LABELS
    assert notice[0]["needs"] == rdma["multinode-fabric"]["needs"]
    assert any("::notice" in s.get("run", "") and "TRAINBASE_RDMA_RUNNERS" in s["run"] for s in notice[0]["steps"])


def test_the_plan_step_is_recognised_in_the_new_spelling_and_the_old():
    """`build.py ci-matrix` (the subcommand) and `build.py --ci-matrix` (its old spelling) are the
    same plan step; anything else printing a matrix is not."""

    def plan(run: str) -> dict:
        return {"jobs": {"plan": {"steps": [{"run": run}]}}}

    for run in (
        'python build.py ci-matrix --since "$BASE" | tee -a "$GITHUB_OUTPUT"',
        'python build.py --ci-matrix --since "$BASE" | tee -a "$GITHUB_OUTPUT"',
    ):
        assert runners._runs_ci_matrix(plan(run), "plan"), run
    for run in ("bash make-cells.sh", "python build.py ci-matrixes", "python build.py list"):
        assert not runners._runs_ci_matrix(plan(run), "plan"), run
