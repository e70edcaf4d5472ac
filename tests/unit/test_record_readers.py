"""Every reader of a record another run wrote (build reports, JUnit reports, the catalogue's
record, locks, gate records, inventories) refuses one it cannot read -- cut short (what a killed
writer or a full disk leaves), not JSON at all, or JSON of another shape -- with exit 2 and one
line naming the file, never a traceback (issue 73). Each reader is driven as a user meets it: the
command, where it has one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainbase.errors import TrainbaseError
from trainbase_common import safe_io, states

from .conftest import ROOT, run_cli

GOOD_REPORT = {"cells": [{"name": "openmpi4.1.4-cuda12.8-cudnn9-debian12", "status": "built", "tag": "r1"}]}
BAD = {
    "cut short": ('{"cells": [{"name": "openmpi4.1.4-cuda12.8-cudnn9-debian12", "sta', r"cut short"),
    "not JSON": ("<html>502 Bad Gateway</html>\n", r"not valid JSON"),
    "wrong shape": ('{"cells": {"openmpi4.1.4": "built"}}', r"'cells' is dict, not list"),
    "a cell that is no record": ('{"cells": ["openmpi4.1.4"]}', r"cells\[0\] is no cell's record"),
    "an unknown state": ('{"cells": [{"name": "x", "status": "done"}]}', r"x's status is 'done'"),
}


def with_record(workdir: Path) -> Path:
    """The workdir with the repository's catalogue record in it (copy_inputs leaves docs/ out)."""
    (workdir / "docs").mkdir(exist_ok=True)
    record = workdir / "docs/catalogue-record.json"
    record.write_text((ROOT / "docs/catalogue-record.json").read_text())
    return record


def python_m(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m ARGV...` from the checkout, as a user or a CI step runs it."""
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def bad_report(tmp_path: Path, case: str) -> tuple[Path, str]:
    text, why = BAD[case]
    report = tmp_path / "build.json"
    report.write_text(text)
    return report, why


def one_line(err: str, path: Path) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert str(path) in lines[0] and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_catalogue_refuses_a_build_report_it_cannot_read(workdir, capsys, tmp_path, case):
    text, why = BAD[case]
    report = tmp_path / "build.json"
    report.write_text(text)
    record = with_record(workdir).read_text()
    code, _, err = run_cli(
        ["catalogue", "--report", str(report), "--where", "here", "--file", str(workdir / "matrix.yaml")], capsys
    )
    assert code == 2, err
    assert re.search(why, one_line(err, report))
    assert (workdir / "docs/catalogue-record.json").read_text() == record  # nothing recorded


@pytest.mark.parametrize(
    "text, why",
    [
        ("<testsuites><testsuite><testcase", "cut short"),
        ("{}", "not XML"),
        ("<html><body/></html>", "its root element is <html>"),
    ],
)
def test_the_catalogue_refuses_a_junit_report_it_cannot_read(workdir, capsys, tmp_path, text, why):
    report, junit = tmp_path / "build.json", tmp_path / "junit.xml"
    report.write_text(json.dumps(GOOD_REPORT))
    junit.write_text(text)
    code, _, err = run_cli(
        [
            "catalogue",
            "--report",
            str(report),
            "--junitxml",
            str(junit),
            "--where",
            "here",
            "--file",
            str(workdir / "matrix.yaml"),
        ],
        capsys,
    )
    assert code == 2 and why in one_line(err, junit), err


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"cells": {"a": {"tag": "r1", "size', "cut short"),
        ("not json", "not valid JSON"),
        ('{"cells": {"openmpi4.1.4-cuda12.8-cudnn9-debian12": 5}}', "is no cell's record"),
    ],
)
def test_the_catalogue_refuses_its_own_record_cut_short_or_of_another_shape(workdir, capsys, text, why):
    with_record(workdir).write_text(text)
    code, _, err = run_cli(["catalogue", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and why in one_line(err, Path("docs/catalogue-record.json")), err


@pytest.mark.parametrize(
    "text, why", [('{"schema": 1, "bases": {"deb', "unreadable"), ("[1]", "must be a JSON object")]
)
def test_the_base_lock_cut_short_or_of_another_shape_stops_every_command(workdir, capsys, text, why):
    (workdir / "locks/bases.json").write_text(text)
    code, _, err = run_cli(["list", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and why in one_line(err, Path("locks/bases.json")), err


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_conformance_suite_refuses_a_build_report_it_cannot_read(tmp_path, case):
    """`pytest trainbase_conformance/checks --report R`: stopped before anything is collected."""
    report, why = bad_report(tmp_path, case)
    r = python_m(
        "pytest",
        "trainbase_conformance/checks/test_nccl_tests.py",
        "--report",
        str(report),
        "-q",
        "-p",
        "no:cacheprovider",
    )
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stdout + r.stderr, report)
    assert re.search(why, line) and line.startswith("Exit: --report "), line


@pytest.mark.parametrize("case", ["cut short", "not JSON", "wrong shape"])
def test_the_attestation_step_refuses_a_build_report_it_cannot_read(tmp_path, case):
    report, why = bad_report(tmp_path, case)
    r = python_m("trainbase.deliver.attest", str(report), "--supply-dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(why, one_line(r.stderr, report))


def test_a_gate_record_cut_short_is_bad_input_not_a_registry_failure(tmp_path):
    from trainbase.deliver import promote

    (tmp_path / "gpu").mkdir()
    bad = tmp_path / "gpu" / "gate.json"
    bad.write_text('{"ref": "r@sha256:ab", "passed": tr')
    with pytest.raises(TrainbaseError, match=r"--gate .*: gate\.json is not a gate record") as e:
        promote.read_gate(tmp_path)
    assert e.value.code == 2 and "\n" not in str(e.value)


def test_a_cells_inventory_cut_short_names_the_file(tmp_path):
    bad = tmp_path / "inventory.json"
    bad.write_text('{"base": {"ref": "debian:12')
    with pytest.raises(safe_io.InputError, match=r"inventory\.json: cut short .*: not a cell's inventory"):
        safe_io.load_record(bad, "a cell's inventory (the supply-chain step's)", {"base": dict})
    bad.write_text('{"base": "debian"}')
    with pytest.raises(safe_io.InputError, match=r"'base' is str, not dict"):
        safe_io.load_record(bad, "a cell's inventory (the supply-chain step's)", {"base": dict})


def test_a_well_formed_build_report_reads():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(GOOD_REPORT, f)
    assert states.usable_images(f.name) == []  # no image ref: nothing to test, no error
    assert states.build_report(f.name)["cells"][0]["status"] == "built"
