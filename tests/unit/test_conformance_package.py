"""The conformance suite as an installable tool: its expectations files (for images trainbase did
not build) are validated with errors that name the file and the field, its command turns tiers
into pytest's marker selection, and its wheel carries every check, probe and data file the
installed suite reads (and registers the plugin)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from trainbase_conformance import TIERS, cli, expectations
from trainbase_conformance.resources import CHECKS, PROBES

from .conftest import ROOT

AZUREML = ROOT / "tests" / "foreign" / "azureml-openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04" / "expectations.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "expect.yaml"
    p.write_text(text)
    return p


def test_the_shipped_foreign_expectations_are_valid():
    data = expectations.load(AZUREML)
    assert data["mpi"]["kind"] == "openmpi" and data["python"]["prefix"] == "/opt/miniconda"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("mpi: {kind: openmpi, version: '4.1'}\n", ["(top level)", "'python' is a required property"]),
        ("python: {prefix: /opt/conda}\nmpi: {kind: mpich, version: '4.1'}\n", ["mpi.kind", "'mpich' is not one of"]),
        ("python: {prefix: opt/conda}\n", ["python.prefix", "does not match"]),
        ("python: {prefix: /opt/conda}\nnccl: 2.18\n", ["nccl", "is not of type 'object'"]),
        ("python: {prefix: /opt/conda}\nframeworks: {jax: '0.4'}\n", ["frameworks", "'jax' was unexpected"]),
        ("python: {prefix: /opt/conda}\ncudaa: {version: '12.1'}\n", ["(top level)", "'cudaa' was unexpected"]),
    ],
)
def test_a_bad_expectations_file_names_the_file_and_the_field(tmp_path, text, names):
    with pytest.raises(expectations.ExpectationsError) as e:
        expectations.load(write(tmp_path, text))
    assert "expect.yaml" in str(e.value)
    for n in names:
        assert n in str(e.value)


def test_not_yaml_and_missing_files_are_clear(tmp_path):
    with pytest.raises(expectations.ExpectationsError, match="not YAML"):
        expectations.load(write(tmp_path, "python: {prefix: [\n"))
    with pytest.raises(expectations.ExpectationsError, match="cannot read"):
        expectations.load(tmp_path / "nope.yaml")


def test_an_undeclared_component_skips_the_check_that_needs_it():
    m = expectations.as_manifest(expectations.load(AZUREML), "img:1", "expectations.yaml")
    assert m["foreign"] and m["components"]["mpi"]["version"] == "4.1.4" and m["frameworks"] == {}
    with pytest.raises(pytest.skip.Exception, match="expectations.yaml declares no 'cuda'"):
        m["components"]["cuda"]


def test_tiers_become_one_marker_expression():
    assert cli.parse_tiers("static, cpu,static") == ["static", "cpu"]
    assert cli.parse_tiers("all") == list(TIERS)
    with pytest.raises(Exception, match="unknown tier gpus"):
        cli.parse_tiers("static,gpus")
    ns, rest = cli.parser().parse_known_args(
        ["img:1", "img:2", "--tier", "gpu,fabric", "--expect", "e.yaml", "--junitxml", "o.xml", "-k", "nccl"]
    )
    args = cli.pytest_args(ns, rest)
    assert args[0] == str(CHECKS) and args[args.index("-m") + 1] == "gpu or fabric"
    assert args.count("--image") == 2 and args[args.index("--expect") + 1] == "e.yaml"
    assert args[-2:] == ["-k", "nccl"] and "--junitxml" in args


def test_report_as_its_help_gives_it_reaches_the_suite_with_its_file(tmp_path, capsys):
    """`trainbase-conformance --report BUILD.json`, as the command's own help writes it: the file
    was taken for an IMAGE and pytest stopped with "argument --report: expected one argument"
    (exit 4). Now it reaches the suite, whose reader refuses a report cut short in one line, exit 2."""
    own, pytest_opts = cli.split_pytest_values(["--report", "reports/build.json", "-k", "nccl and not gpu", "-x"])
    ns, rest = cli.parser().parse_known_args(own)
    assert ns.images == []  # neither the report nor -k's expression is taken for an image
    args = cli.pytest_args(ns, rest + pytest_opts)
    assert args[args.index("--report") + 1] == "reports/build.json" and "--image" not in args
    assert args[-3:] == ["-x", "-k", "nccl and not gpu"]
    cut = tmp_path / "build.json"
    cut.write_text('{"cells": [{"name": "a"')
    r = subprocess.run(
        [sys.executable, "-m", "trainbase_conformance", "--report", str(cut), "--markdown", str(tmp_path / "c.md")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2, r.stdout[-800:] + r.stderr[-800:]
    assert f"--report {cut}: cut short" in r.stdout + r.stderr


def test_the_command_refuses_a_bad_expectations_file_before_any_container(tmp_path, capsys):
    bad = write(tmp_path, "python: {prefix: /x}\nmpi: {kind: openmpi}\n")
    assert cli.main(["img:1", "--expect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "expect.yaml" in err and "'version' is a required property" in err


def test_the_wheel_carries_the_checks_probes_data_and_plugin(tmp_path):
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "conformance-wheel.sh"), "build", str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    (wheel,) = tmp_path.glob("trainbase_conformance-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for check in CHECKS.glob("test_*.py"):
        assert f"trainbase_conformance/checks/{check.name}" in names
    for probe in PROBES.iterdir():
        assert f"trainbase_conformance/probes/{probe.name}" in names
    assert {
        "trainbase_conformance/data/doctor.schema.json",
        "trainbase_conformance/expectations.schema.json",
        "trainbase_conformance/data/examples/pytorch_ddp.py",
    } <= names
    # every module of both packages, subpackages included (the engine adapter is one)
    for package in ("trainbase_conformance", "trainbase_common"):
        for module in (ROOT / package).rglob("*.py"):
            assert str(module.relative_to(ROOT)) in names
    assert not [n for n in names if "__pycache__" in n]
    dist = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(wheel).read(dist).decode()
    assert "trainbase_conformance.plugin = trainbase_conformance.plugin" in entry_points
    assert "trainbase-conformance = trainbase_conformance.cli:main" in entry_points
    # the doctor's schema in the wheel is the published one
    packed = json.loads(zipfile.ZipFile(wheel).read("trainbase_conformance/data/doctor.schema.json"))
    assert packed == json.loads((ROOT / "docs" / "doctor.schema.json").read_text())


def test_require_hardware_turns_the_gpu_tiers_skip_into_a_failure(tmp_path):
    """On a host without a GPU the gpu tier is skipped with its reason; with --require-hardware
    (what gpu.yml passes on its GPU runners) each of its checks fails with that reason, before
    any container starts (the image need not even exist)."""
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi: the gpu tier would run")
    ns, rest = cli.parser().parse_known_args(["img:1", "--tier", "gpu", "--require-hardware"])
    assert "--require-hardware" in cli.pytest_args(ns, rest)

    def run(*extra):
        junit = tmp_path / f"j{len(extra)}.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(CHECKS),
                "-m",
                "gpu",
                "--image",
                "absent/image:none",
                "-p",
                "no:cacheprovider",
                "-q",
                "--junitxml",
                str(junit),
                "--conformance-report",
                str(tmp_path / "c.md"),
                *extra,
            ],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        cases = list(ET.parse(junit).getroot().iter("testcase"))  # noqa: S314 -- the JUnit file this test's pytest wrote
        # the image's verdict (checks/test_verdict.py) judges the others: none ran, so it fails
        verdicts = [c for c in cases if c.get("classname", "").endswith("test_verdict")]
        assert len(verdicts) == 1 and "no check ran against absent/image:none" in verdicts[0].find("failure").get(
            "message"
        )
        cases = [c for c in cases if c not in verdicts]
        return cases, [c.find("failure") if c.find("failure") is not None else c.find("error") for c in cases]

    cases, problems = run()
    assert cases and all(c.find("skipped") is not None for c in cases)
    cases, problems = run("--require-hardware")
    assert cases and all(p is not None and "tier gpu: no usable GPU" in p.get("message", "") for p in problems)


def test_the_foreign_images_recorded_verdict_names_real_checks():
    """outcomes.json (what scripts/foreign-image.sh requires of Azure ML's rebuilt image) names
    checks that exist: each failure with a pattern and its reason, every other check with its
    state. A renamed check cannot leave the verdict stale."""
    import ast
    import re

    outcomes = json.loads((AZUREML.parent / "outcomes.json").read_text())
    assert outcomes["tiers"] == "static,cpu" and outcomes["must_fail"] and outcomes["states"]
    assert not set(outcomes["must_fail"]) & set(outcomes["states"])
    for name in [*outcomes["must_fail"], *outcomes["states"]]:
        module, check = name.split("::")
        tree = ast.parse((CHECKS / f"{module}.py").read_text())
        assert check in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name
    for name, spec in outcomes["must_fail"].items():
        re.compile(spec["message"])
        assert len(spec["why"]) > 20, f"{name}: say why it fails"
    assert set(outcomes["states"].values()) <= {"passed", "skipped"}


def test_the_foreign_images_recorded_verdict_covers_every_check_of_its_tiers():
    """Every check of the tiers the foreign image is run in has a recorded state, and none of
    another tier is recorded: a new check (test_llm_stack's, which reddened CI at the last step of
    a 53-minute run) is named here, in the unit tests, not only after the image is rebuilt."""
    from tests.conformance import failures

    outcomes = json.loads((AZUREML.parent / "outcomes.json").read_text())
    tiers = set(outcomes["tiers"].split(","))
    # the failure table's reading of the checks (imported, marks applied any way count)
    checks, problems = failures.collect_checks()
    assert not problems, problems
    run = {f"{c.file.removesuffix('.py')}::{c.name}" for c in checks.values() if c.tier in tiers}
    recorded = set(outcomes["must_fail"]) | set(outcomes["states"])
    assert not run - recorded, (
        f"checks of tiers {outcomes['tiers']} with no recorded state (run scripts/foreign-image.sh, review, then tests.conformance.verdict --record): {sorted(run - recorded)}"
    )
    assert not recorded - run, f"recorded, but not of tiers {outcomes['tiers']}: {sorted(recorded - run)}"


def test_the_expectations_example_in_the_docs_is_valid(tmp_path):
    """docs/conformance.md's example file follows the schema it documents."""
    import re

    text = (ROOT / "docs" / "conformance.md").read_text()
    example = re.search(r"```yaml\n(# expectations.yaml\n.*?)```", text, re.S).group(1)
    data = expectations.load(write(tmp_path, example))
    # Azure ML's base image has no framework: the example must not claim one (issue 55)
    assert data["mpi"]["kind"] == "openmpi" and "frameworks" not in data
    # the commented line, for an image that has one, follows the schema too
    with_torch = re.sub(r"^# (frameworks: .*?)\s+#.*$", r"\1", example, flags=re.M)
    assert expectations.load(write(tmp_path, with_torch))["frameworks"] == {"pytorch": "2.5.1"}
