"""The environment contract (issue 61): every `$VAR` a rendered Dockerfile expands is set where the
build expands it. The manifest block's `assert sys.prefix == '$VIRTUAL_ENV'` failed every conda
(Ubuntu) row's build because only the venv (Debian) row sets VIRTUAL_ENV; nothing read a rendered
Dockerfile's environment the way a build does. trainbase/render/env_contract.py does, and
`build.py check` runs it."""

import json
from pathlib import Path

import pytest

from trainbase.define import base_lock
from trainbase.define.matrix import load
from trainbase.render import env_contract as ec
from trainbase.render import recipes

from .conftest import ROOT, run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "env_contract"
CONDA = "openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"
CONDA_CHILD = "pytorch2.10.0-openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"
VENV = "openmpi4.1.4-cuda13.2-cudnn9-debian12"
VENV_CHILD = "pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"


def fixture(cell: str) -> str:
    return (FIXTURES / f"{cell}.Dockerfile").read_text()


def walk(tmp_path: Path, **texts: str) -> ec.Contract:
    return ec.check(tmp_path, {cell.replace("_", "-"): text for cell, text in texts.items()})


def found(contract: ec.Contract) -> list[tuple[str, int, str, str]]:
    return sorted((f.cell, f.line, f.stage, f.var) for f in contract.findings)


# --------------------------------------------------------------------------- the shell scan


@pytest.mark.parametrize(
    ("line", "refs"),
    [
        ('echo $A ${B} "$C" "x${D}y"', ["A", "B", "C", "D"]),
        ("echo '$A' \"it's $B\" '\"$C\"'", ["B"]),  # single quotes are literal; in double quotes ' is not
        ('echo \\$A "\\$B" \\\\$C', ["C"]),  # \$ is no reference; \\ is an escaped backslash
        ("echo $$ $? $# $@ $* $! $- $0 $9 ${1} ${@} $", []),  # special and positional parameters
        ('x=$(dirname "$A") y=$((B + 1)) z="$(echo \'$C\')"', ["A"]),  # $( ) is followed into, ' stays literal
        ("echo $'$A' # and $B in a comment", []),  # ANSI-C quoting, a comment
        ("echo a#$A", ["A"]),  # not a comment: # inside a word
        ('cmd "$(python -c \'import s; print(s.p["purelib"])\')"/$A', ["A"]),
    ],
)
def test_scan_finds_what_the_shell_expands(line, refs):
    assert [r.name for r in ec.scan(line)] == refs


def test_scan_marks_what_handles_an_unset_variable():
    refs = {r.name: r.handled for r in ec.scan("${A:-x} ${B-} ${C:=y} ${D:+z} ${E+z} ${#F} ${G:?no} ${H%/*} ${!I}")}
    assert refs == dict(A=True, B=True, C=True, D=True, E=True, F=True, G=False, H=False, I=False)
    assert [r.name for r in ec.scan("${A:-$B}")] == ["A", "B"]  # the default word is read too


def test_the_builders_own_expansion_has_no_command_substitution():
    assert [r.name for r in ec.scan("A=$(B) C='$D' E=\"$F\"", shell=False)] == ["F"]


def test_what_a_run_line_sets_itself():
    line = (
        "x=1 && export Y=2 Z && for t in a b; do :; done; read -r u v < f; local L; declare -a ARR; "
        "A=1 B=2 cmd C=3; y=$(E=2 f); if true; then F=1; fi; "
        "env -i PATH=/bin HOME=/tmp python3 -c \"sys.prefix == 'p'; v = 1\"; echo X=$X; make CC=gcc"
    )
    assert ec.sets(line) == {"x", "Y", "Z", "t", "u", "v", "L", "ARR", "A", "B", "y", "E", "F"}
    # arguments are not assignments: `echo VIRTUAL_ENV=$VIRTUAL_ENV` must not hide an unset VIRTUAL_ENV
    assert ec.sets("./configure --prefix=/opt/x CC=gcc && echo VIRTUAL_ENV=$VIRTUAL_ENV") == set()


# --------------------------------------------------------------------------- Dockerfiles


def test_a_run_line_is_read_as_the_builder_joins_it_and_the_finding_names_its_physical_line(tmp_path):
    text = (
        "FROM debian:12.15-slim AS os\n"
        "# a comment\n"
        "RUN --mount=type=cache,target=/root/.cache \\\n"
        "    echo one \\\n"
        "    # a comment line inside the continuation: dropped\n"
        ' && echo "$MISSING" \\\n'
        " && echo '$LITERAL' \\$ESCAPED ${GUARDED:-} \\\n"
        ' && if [ -n "${OPTIONAL:-}" ]; then echo "$OPTIONAL"; fi \\\n'
        " && site=$(python -c 'print(1)') && echo $site $HOME $PATH $BASH_VERSION \\\n"
        " && for so in a b; do echo $so; done && echo $MISSING\n"
    )
    c = walk(tmp_path, cell=text)
    assert found(c) == [("cell", 6, "os", "MISSING")]  # once per instruction, where it is first used
    assert str(c.findings[0]) == (
        "cell/Dockerfile:6: RUN uses $MISSING, unset at this point (stage os; base debian:12.15-slim contract)"
    )
    assert c.instructions == 2 and c.summary().startswith("environment contract: 1 Dockerfiles, 2 instructions")


def test_env_in_both_forms_and_each_pair_sees_the_environment_before_it(tmp_path):
    text = (
        "FROM debian:12.15-slim\n"
        "ENV A=1 B=$A\n"  # Docker expands B against the env before this ENV: A is not set yet
        "ENV C $A\n"  # the legacy form
        "ENV D=\"x $C\" E='$NOPE' F=${UNSET:-default}\n"
        'LABEL x="$G"\n'
        "WORKDIR /opt/$D\n"
    )
    c = walk(tmp_path, cell=text)
    assert found(c) == [("cell", 2, "0", "A"), ("cell", 5, "0", "G")]
    env, _ = c.final["cell"]
    assert env["C"] == "1" and env["D"] == "x 1"


def test_stages_inherit_env_but_not_args_and_global_args_reach_from_lines_only(tmp_path):
    text = (
        "ARG BASE=debian:12.15-slim\n"
        "ARG V=1\n"
        "FROM ${BASE} AS a\n"
        "ENV X=1\n"
        "ARG Q=2\n"
        "RUN echo $X $Q $V\n"  # V: a global ARG, not declared in this stage
        "FROM a AS b\n"
        "ARG V\n"  # declared without a value: the global's
        "RUN echo $X $V $Q\n"  # Q: an ARG of stage a, not carried into b
        "FROM debian:12.15-slim AS c\n"
        "RUN echo $X\n"  # not FROM a: nothing set X
        "FROM $NOWHERE AS d\n"
    )
    c = walk(tmp_path, cell=text)
    assert [(line, stage, var) for _, line, stage, var in found(c)] == [
        (6, "a", "V"),
        (9, "b", "Q"),
        (11, "c", "X"),
        (12, "d", ""),  # no start known: named, with how to fix it
        (12, "global", "NOWHERE"),
    ]
    assert "lock-bases" in next(f.message for f in c.findings if f.line == 12 and not f.var)


def test_a_framework_image_starts_from_its_parent_cells_final_environment(tmp_path):
    parent = "FROM debian:12.15-slim AS os\nENV P=1\nFROM os AS image\nENV Q=$P\n"
    child = "ARG TRAINBASE_NAMESPACE=trainbase\nFROM ${TRAINBASE_NAMESPACE}/parent-cell:r0123\nRUN echo $P $Q $Z\n"
    grandchild = "ARG TRAINBASE_NAMESPACE=trainbase\nFROM ${TRAINBASE_NAMESPACE}/child-cell:r4567\nRUN echo $Z\n"
    c = walk(tmp_path, parent_cell=parent, child_cell=child, grandchild_cell=grandchild)
    assert found(c) == [("child-cell", 3, "0", "Z"), ("grandchild-cell", 3, "0", "Z")]
    assert "(stage 0; parent child-cell; parent parent-cell; base debian:12.15-slim contract)" in str(
        next(f for f in c.findings if f.cell == "grandchild-cell")
    )


def test_base_families_and_the_locked_env(tmp_path):
    devel = ec.family_env("nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04@sha256:" + "a" * 64)
    runtime = ec.family_env("nvcr.io/nvidia/cuda:13.0.1-runtime-ubuntu22.04")
    base = ec.family_env("nvidia/cuda:12.9.1-base-ubuntu24.04")
    assert devel and runtime and base
    assert {"CUDA_VERSION", "LIBRARY_PATH", "NV_CUDNN_PACKAGE_DEV", "NV_LIBNCCL_DEV_PACKAGE"} <= devel.keys()
    assert "LIBRARY_PATH" not in runtime and "NCCL_VERSION" in runtime and "NCCL_VERSION" not in base
    assert devel["PATH"].startswith("/usr/local/cuda/bin:") and "VIRTUAL_ENV" not in devel
    assert ec.family_env("trainbase-bootstrap/debian:12.15-slim") == {"PATH": ec.DEFAULT_PATH}
    assert ec.family_env("ubuntu:24.04") is None and ec.family_env("nvidia/cuda:12.8.1-cudnn") is None

    # a base whose Env lock-bases recorded starts from it
    base_lock.write(
        tmp_path,
        {"ubuntu:24.04": base_lock.BaseLock("ubuntu:24.04", base_lock.REGISTRY, "sha256:" + "b" * 64, env=["FOO=1"])},
    )
    c = walk(tmp_path, cell="FROM ubuntu:24.04\nRUN echo $FOO $PATH $BAR\n")
    assert [f.var for f in c.findings] == ["BAR"] and "base ubuntu:24.04 lock" in c.findings[0].message
    assert c.final["cell"][0]["PATH"] == ec.DEFAULT_PATH  # no PATH in the config: BuildKit's default


def test_the_lock_keeps_old_files_loadable_and_writes_env_only_where_recorded(tmp_path):
    lock = {
        "debian:12.15-slim": base_lock.BaseLock("debian:12.15-slim", base_lock.BOOTSTRAP, "packages-sha256:1"),
        "x:1": base_lock.BaseLock("x:1", base_lock.REGISTRY, "sha256:2", env=["PATH=/bin", "A=b=c"]),
    }
    base_lock.write(tmp_path, lock)
    doc = json.loads((tmp_path / base_lock.LOCK_FILE).read_text())
    assert "env" not in doc["bases"]["debian:12.15-slim"] and doc["bases"]["x:1"]["env"] == ["PATH=/bin", "A=b=c"]
    assert base_lock.load(tmp_path) == lock
    # entries written before the field have none; those written since (debian:13.8-slim) have KEY=VALUE items
    committed = base_lock.load(ROOT)
    assert committed and all(e.env is None or all("=" in kv for kv in e.env) for e in committed.values())
    assert any(e.env is None for e in committed.values())


def test_exec_form_and_instructions_the_builder_does_not_expand(tmp_path):
    text = 'FROM debian:12.15-slim\nRUN ["echo", "$A"]\nSHELL ["/bin/bash", "-c"]\nCMD echo $B\nCOPY $C /x\n'
    assert found(walk(tmp_path, cell=text)) == [("cell", 5, "0", "C")]


# --------------------------------------------------------------------------- the rendered cells


def test_the_defect_is_found_in_the_conda_cell_and_its_framework_child(tmp_path):
    c = walk(tmp_path, **{CONDA: fixture(CONDA), CONDA_CHILD: fixture(CONDA_CHILD)})
    assert found(c) == [(CONDA, 204, "image", "VIRTUAL_ENV"), (CONDA_CHILD, 54, "0", "VIRTUAL_ENV")]
    assert str(next(f for f in c.findings if f.cell == CONDA)) == (
        f"{CONDA}/Dockerfile:204: RUN uses $VIRTUAL_ENV, unset at this point "
        "(stage image; base nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04 contract)"
    )
    assert "assert sys.prefix == '$VIRTUAL_ENV'" in fixture(CONDA).splitlines()[203]
    # line 199's `if [ -n "${VIRTUAL_ENV:-}" ]; then ... "$VIRTUAL_ENV"` handles the unset case: no finding


def test_the_venv_cells_pass_and_end_with_virtual_env_on_path(tmp_path):
    c = walk(tmp_path, **{VENV: fixture(VENV), VENV_CHILD: fixture(VENV_CHILD)})
    assert c.findings == [] and len(c.final) == 2
    env, origin = c.final[VENV_CHILD]
    assert env["VIRTUAL_ENV"] == "/opt/trainbase/venv" and "/opt/trainbase/venv/bin" in env["PATH"].split(":")
    assert origin == f"parent {VENV}; base debian:12.15-slim contract"


def test_the_standalone_entry_reads_images_and_fails_on_a_finding(tmp_path, capsys):
    for cell in (CONDA, CONDA_CHILD, VENV):
        (tmp_path / "images" / cell).mkdir(parents=True)
        (tmp_path / "images" / cell / "Dockerfile").write_text(fixture(cell))
    assert ec.main(["--root", str(tmp_path), VENV]) == 0
    assert capsys.readouterr().out.startswith("environment contract: 1 Dockerfiles, ")
    assert ec.main(["--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "3 Dockerfiles" in err and "2 unset variables in 2 cell(s)" in err
    assert f"  {CONDA_CHILD}/Dockerfile:54: RUN uses $VIRTUAL_ENV" in err
    assert ec.main(["--root", str(tmp_path), "no-such-cell"]) == 1
    assert "no Dockerfile under images/no-such-cell" in capsys.readouterr().err


def test_a_variable_planted_in_a_template_block_is_found_in_every_cell_naming_cell_and_line(
    workdir, capsys, monkeypatch
):
    launch = workdir / "templates" / "blocks" / "launch.j2"
    text = launch.read_text()
    assert " && tb-launch --json > /dev/null\n" in text
    launch.write_text(
        text.replace(
            " && tb-launch --json > /dev/null\n",
            " && tb-launch --json > /dev/null \\\n && echo \"$TB_PLANTED\" '$TB_QUOTED' \\$TB_ESCAPED\n",
        )
    )
    rendered = recipes.render_all(load(workdir / "matrix.yaml"), root=workdir)
    texts = {r.cell.name: r.files[r.dockerfile] for r in rendered.values()}
    planted = [f for f in ec.check(workdir, texts).findings if f.var.startswith("TB_")]
    base_cells = {r.cell.name for r in rendered.values() if not r.cell.parent}  # the launch block's
    assert {f.cell for f in planted} == base_cells and len(planted) == len(base_cells)
    for f in planted:
        assert f.var == "TB_PLANTED" and f.stage == "image"
        assert '&& echo "$TB_PLANTED"' in texts[f.cell].splitlines()[f.line - 1]

    # build.py check runs it after the drift check (the drift check is not what this test is about)
    monkeypatch.setattr(recipes, "check", lambda *a, **k: [])
    code, out, err = run_cli(["check", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 1 and "ok: images/ matches" in out
    f = planted[0]
    assert f"  {f.cell}/Dockerfile:{f.line}: RUN uses $TB_PLANTED, unset at this point (stage image; " in err


def test_no_rendered_cell_expands_an_unset_variable(capsys, monkeypatch):
    """The guard itself: every cell the templates render passes (it failed the 148 conda cells at
    b65c5a1, before the manifest block stopped reading $VIRTUAL_ENV on the conda rows)."""
    rendered = recipes.render_all(load(ROOT / "matrix.yaml"), root=ROOT)
    c = ec.check(ROOT, {r.cell.name: r.files[r.dockerfile] for r in rendered.values()})
    assert len(c.final) == len(rendered) >= 99
    assert not c.findings, f"{len(c.findings)} unset variable(s):\n" + "\n".join(map(str, c.findings[:20]))
    assert all(c.final[n] for n in c.final) and c.instructions > 20 * len(rendered)
