"""No pipeline may end early under pipefail (issue 27): `ldconfig -p | grep -q X` in a RUN
line under `SHELL [... "-o", "pipefail" ...]` failed a fresh build with exit 141 by chance.
The rule runs over every rendered cell, the workflows, scripts/ and the in-image tools."""

import pytest

from trainbase.define.matrix import load
from trainbase.render import pipefail_lint as pl
from trainbase.render import recipes

from .conftest import ROOT


def test_no_rendered_cell_workflow_or_script_has_a_pipeline_that_can_die_of_sigpipe():
    rendered = recipes.render_all(load(ROOT / "matrix.yaml"), root=ROOT)
    assert len({r.cell.name for r in rendered.values()}) >= 99
    dockerfiles = {r.dockerfile: r.files[r.dockerfile] for r in rendered.values()}
    findings = pl.check_repository(ROOT, dockerfiles)
    assert not findings, f"{len(findings)} pipeline(s) can fail by chance under pipefail:\n" + "\n".join(
        str(f) for f in findings[:20]
    )


def test_the_rule_reads_every_place_shell_lives():
    """It really parses the workflows' run: blocks, the scripts and the in-image tools."""
    names = {str(p.relative_to(ROOT)) for p in pl.shell_files(ROOT)}
    assert {"scripts/setup.sh", "scripts/test.sh", ".ci/run", "imagefs/usr/local/bin/tb-fetch"} <= names
    runs = [r for p in (ROOT / ".github").rglob("*.yml") for r in pl._runs(__import__("yaml").safe_load(p.read_text()))]
    assert len(runs) >= 10
    # the suite's broken variants build FROM trainbase images (pipefail SHELL): one of them
    # failed a clean-room build by chance on `ucx_info -b | grep -Eq ...` (exit 141)
    dockerfiles = {str(p.relative_to(ROOT)) for p in pl.repository_dockerfiles(ROOT)}
    assert "tests/conformance/broken/no-ucx-ib/Dockerfile" in dockerfiles and len(dockerfiles) >= 20


def test_the_nccl_line_that_failed_a_build_is_found_with_its_cell_block_and_lines():
    text = (
        'FROM scratch AS image\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
        "# --- block: nccl (2.30.7) ---\n"
        "RUN --mount=type=cache,target=/root/.cache/pip \\\n"
        "    --mount=type=bind,source=locks,target=/tmp/locks \\\n"
        "    tb-pip-install /tmp/locks/nccl.txt \\\n"
        " && tb-register-nvidia-libs \\\n"
        " && ldconfig -p | grep -q 'libnccl.so.2 '\n"
    )
    [f] = pl.check_dockerfile(text, "images/openmpi5.0.11-cuda13.0-cudnn9-debian12/Dockerfile")
    assert f.where == "images/openmpi5.0.11-cuda13.0-cudnn9-debian12/Dockerfile:4-8 (block nccl)"
    assert f.pipeline == "ldconfig -p | grep -q 'libnccl.so.2 '"
    assert "grep -q" in f.why and "SIGPIPE" in f.why


@pytest.mark.parametrize(
    "line",
    [
        "ldconfig -p | grep -q x",
        "a | grep -qE x",
        "a | grep -Fxq x",
        "a | grep --quiet x",
        "a | egrep -l x",
        "a | grep -m1 x",
        "a | grep -m 1 x",
        "a | grep --max-count=1 x",
        "a | head -n 1",
        "a | head -1",
        "a | sed -n '1p;q'",
        "a | sed 5q",
        "a | sed -e '/x/q'",
        "a | awk '/x/ { print; exit }'",
        "a | read v",
        "x=$(a | head -c 10)",
        'a | { read first; echo "$first"; }',
        "a | b | grep -q c",
        "sudo -n a | grep -q b",
        "if a | grep -q b; then :; fi",
        "a |& head",
        "a | timeout 5 grep -q b",
    ],
)
def test_early_exit_consumers_are_found(line):
    assert pl.check_shell(line, "t"), line


@pytest.mark.parametrize(
    "line",
    [
        "ldconfig -p | grep 'libnccl.so.2 ' >/dev/null",
        "a | grep -c x",
        "a | grep -e -q",
        "a | grep -f pats -e x",
        'grep -q x <<<"$(a)"',
        "grep -q x file",
        "a | sed -n '1,5p'",
        "a | sed 's/q/x/'",
        "a | tail -n 1",
        "a | awk '{print $1}'",
        "a | sort -u | wc -l",
        "echo 'x | grep -q y'",
        "a || grep -q b",
        "a | grep -- -q",
        "a | sed -e 's/quit/exit/'",
    ],
)
def test_consumers_that_read_to_the_end_pass(line):
    assert not pl.check_shell(line, "t"), line


def test_workflow_expressions_are_words_and_lines_are_the_files(tmp_path):
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    wf = tmp_path / ".github" / "workflows" / "x.yml"
    wf.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: |\n"
        '          echo ${{ matrix.cell }}\n          docker images | grep -q "${{ matrix.cell }}"\n'
    )
    [f] = pl.check_workflow(wf, tmp_path)
    assert f.where == ".github/workflows/x.yml:8" and "grep -q" in f.why


def test_a_run_line_that_is_not_bash_is_reported_not_skipped():
    [f] = pl.check_dockerfile("FROM x\n# --- block: os ---\nRUN if then fi (\n", "D")
    assert f.where == "D:3-3 (block os)" and "does not parse" in f.why
