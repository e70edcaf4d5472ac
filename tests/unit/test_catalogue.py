"""The image catalogue (docs/images.md, docs/images.json): generated from matrix.yaml, the
manifests and the record of real runs, never edited by hand (issue 55)."""

from __future__ import annotations

import json
from pathlib import Path

from trainbase.define.matrix import load
from trainbase.render import catalogue

from .conftest import ROOT

DOCTOR_NODE = ROOT / "imagefs" / "opt" / "trainbase" / "lib" / "trainbase_doctor" / "checks_node.py"
# a testcase as the suite writes it to pytest's JUnit (plugin.py: the image and tier properties)
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="trainbase_conformance.checks.test_mpi" name="test_ompi_info_version[trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1]" time="1.2">
<properties><property name="image" value="trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1"/><property name="tier" value="static"/></properties></testcase>
<testcase classname="trainbase_conformance.checks.test_mpi" name="test_mpi4py_allreduce_4_ranks[trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1]" time="3.0">
<properties><property name="image" value="trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1"/><property name="tier" value="cpu"/></properties></testcase>
<testcase classname="trainbase_conformance.checks.test_speed" name="test_x[trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1]" time="3.0">
<properties><property name="image" value="trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1"/><property name="tier" value="cpu"/></properties>
<failure message="bandwidth 0.2x the host's">x</failure></testcase>
<testcase classname="trainbase_conformance.checks.test_cuda" name="test_gpu[trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1]" time="0.0">
<properties><property name="image" value="trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:r1"/><property name="tier" value="gpu"/></properties>
<skipped message="no GPU">x</skipped></testcase>
<testcase classname="tests.unit.test_x" name="test_unit" time="0.1"/>
</testsuite></testsuites>"""


def test_the_catalogue_is_what_the_generator_writes():
    m = load(ROOT / "matrix.yaml")
    assert catalogue.drift(m, ROOT) == [], "docs/images.md or docs/images.json is stale: run `build.py catalogue`"


def test_every_rendered_cell_has_a_row_and_only_those():
    doc = json.loads((ROOT / catalogue.TWIN).read_text())
    names = {r["name"] for r in doc["images"]}
    rendered = {p.name for p in (ROOT / "images").iterdir() if (p / "manifest.json").is_file()}
    assert names == rendered


def test_the_driver_column_is_the_images_promise():
    """The drivers each row names come from trainbase_common.driver_promise (the one table of driver
    branches, which tb-doctor ships a copy of); tests/unit/test_driver_promise.py holds every image's
    NVIDIA_REQUIRE_CUDA to them."""
    m = load(ROOT / "matrix.yaml")
    rows = {x.name: x for x in catalogue.rows(m, ROOT, {"cells": {}})}
    ubuntu, debian = rows["openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"], rows["openmpi4.1.4-cuda12.8-cudnn9-debian12"]
    assert (ubuntu.min_driver, ubuntu.forward_compat_branches) == (">= 570.26", [470, 535, 550, 560, 565])
    assert ubuntu.promise.text() == "570.26+, or R470/R535/R550/R560/R565 on data-center GPUs (forward compatibility)"
    assert (debian.min_driver, debian.forward_compat_branches, debian.promise.text()) == (">= 570.26", [], "570.26+")
    assert DOCTOR_NODE.with_name("cuda_requirement.py").is_file()


def test_a_recorded_run_gives_the_size_where_and_the_tiers(tmp_path: Path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    tiers = catalogue.tiers_from_junit(junit)
    assert tiers == {
        "openmpi4.1.4-cuda12.8-cudnn9-debian12": {
            "static": {"passed": 1, "failed": 0, "skipped": 0},
            "cpu": {"passed": 1, "failed": 1, "skipped": 0},
            "gpu": {"passed": 0, "failed": 0, "skipped": 1},
        }
    }
    record: dict = {"cells": {}}
    report = {
        "cells": [
            {
                "name": "openmpi4.1.4-cuda12.8-cudnn9-debian12",
                "status": "built",
                "tag": "r1",
                "size_bytes": 2_930_000_000,
                "image_id": "sha256:ab",
            },
            {"name": "intelmpi2021.18-cuda12.8-cudnn9-debian12", "status": "failed", "size_bytes": None},
        ]
    }
    assert catalogue.record_run(record, report, tiers, "ci profile, .ci/run", "2026-11-27") == [
        "openmpi4.1.4-cuda12.8-cudnn9-debian12"
    ]
    m = load(ROOT / "matrix.yaml")
    rows = {r.name: r for r in catalogue.rows(m, ROOT, record)}
    text = catalogue.markdown(rows.values())
    line = next(ln for ln in text.splitlines() if ln.startswith("| `openmpi4.1.4-cuda12.8-cudnn9-debian12`"))
    assert (
        "2.93 GB" in line
        and "static passed (1); cpu FAILED 1 (1)" in line
        and "(ci profile, .ci/run, 2026-11-27)" in line
    )
    assert "gpu" not in line.split("|")[-2]  # a tier whose every check skipped is not "passed"
    other = next(ln for ln in text.splitlines() if ln.startswith("| `intelmpi2021.18-cuda12.8-cudnn9-debian12`"))
    assert "not built yet" in other  # a failed build records nothing


def test_a_row_says_what_the_manifest_holds():
    m = load(ROOT / "matrix.yaml")
    r = {x.name: x for x in catalogue.rows(m, ROOT, {"cells": {}})}[
        "pytorch2.10.0-openmpi4.1.4-cuda12.8-cudnn9-debian12"
    ]
    manifest = json.loads((ROOT / "images" / r.name / "manifest.json").read_text())
    assert r.nccl == manifest["components"]["nccl"]["version"] and r.framework == "pytorch"
    assert r.frameworks["pytorch"]["torch"] == "2.10.0" and r.min_driver == ">= 570.26"


def test_a_record_of_an_earlier_recipe_says_so_beside_its_figures():
    """A template or in-image tool change re-tags the cell: the record's size and tiers then
    describe the last build, not the current recipe, and the page says which."""
    m = load(ROOT / "matrix.yaml")
    name = "openmpi4.1.4-cuda12.8-cudnn9-debian12"
    record = {
        "cells": {
            name: {
                "tag": "r000000000000",
                "size_bytes": 2_930_000_000,
                "where": "w",
                "date": "d",
                "tiers": {"static": {"passed": 9, "failed": 0, "skipped": 0}},
            }
        }
    }
    tags = catalogue.current_tags(m, ROOT)
    stale = {r.name: r for r in catalogue.rows(m, ROOT, record, tags)}[name]
    assert stale.recorded_at_another_recipe
    assert f"2.93 GB (as r000000000000; the recipe is {tags[name]} since)" in catalogue.markdown([stale])
    record["cells"][name]["tag"] = tags[name]
    current = {r.name: r for r in catalogue.rows(m, ROOT, record, tags)}[name]
    assert not current.recorded_at_another_recipe
    assert "| 2.93 GB |" in catalogue.markdown([current])


def test_a_build_run_prints_the_one_command_that_records_it(tmp_path: Path, monkeypatch):
    """`build.py build --report R` ends with the command that records R in the catalogue; that
    command is one the catalogue's own parser takes, and it says where the run was."""
    import shlex

    from trainbase.cli.parser import parser

    line = catalogue.record_command("reports/build.json", "reports/conformance.xml", "local")
    argv = shlex.split(line)
    assert argv[1:3] == ["build.py", "catalogue"], line
    ns = parser().parse_args(argv[2:])
    assert (ns.report, ns.junitxml) == ("reports/build.json", "reports/conformance.xml")
    assert ns.where.startswith("local profile, build.py build, ") and "-core " in ns.where, ns.where
    assert "--junitxml" not in catalogue.record_command("r.json", None, None)
    # what the README's main command prints at its end is this line
    readme = (ROOT / "README.md").read_text()
    assert "build.py --matrix --profile local --report reports/build.json" in readme
