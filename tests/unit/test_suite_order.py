"""The conformance plugin's collection: checks grouped by image (each image's containers,
conversions and clusters set up once), and --derived-tiers deselecting, never passing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trainbase_conformance import collection

REFS = ["trainbase/base:r1", "trainbase/fw-base:r2", "trainbase/orphan:r3"]


def _item(module: str, test: str, image: str | None, tier: str = "static"):
    return SimpleNamespace(
        nodeid=f"checks/{module}.py::{test}[{image}]",
        callspec=SimpleNamespace(params={"image": image}) if image else None,
        get_closest_marker=lambda name, tier=tier: name == tier or None,
    )


def test_checks_run_image_by_image_then_module_by_module_keeping_pytest_order_within():
    items = [
        _item("test_runtime", "podman", "a"),
        _item("test_mpi", "ranks", "b"),
        _item("test_runtime", "podman", "b"),
        _item("test_mpi", "ranks", "a"),
        _item("test_runtime", "charliecloud", "a"),
        _item("test_mpi", "version", "a"),
    ]
    collection.group_by_image(items)
    assert [(i.callspec.params["image"], i.nodeid.split("::")[1]) for i in items] == [
        ("a", "podman[a]"),
        ("a", "charliecloud[a]"),
        ("a", "ranks[a]"),
        ("a", "version[a]"),
        ("b", "podman[b]"),
        ("b", "ranks[b]"),
    ]


class _Config:
    def __init__(self, report, tiers):
        self.options = {"--report": [str(report)], "--image": [], "--derived-tiers": tiers}
        self.stash = {}
        self.deselected = []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

    def getoption(self, name):
        return self.options[name]


@pytest.fixture
def report(tmp_path):
    cells = [
        {"name": "base", "image": "trainbase/base:r1", "status": "cached", "parent": None},
        {"name": "fw-base", "image": "trainbase/fw-base:r2", "status": "built", "parent": "base"},
        {"name": "orphan", "image": "trainbase/orphan:r3", "status": "built", "parent": "absent"},
    ]
    path = tmp_path / "build.json"
    path.write_text(json.dumps({"cells": cells}))
    return path


def test_derived_tiers_deselects_only_the_derived_image_s_other_tiers(report):
    items = [
        _item("test_runtime", "podman", "base:r1", "runtime"),
        _item("test_runtime", "podman", "fw-base:r2", "runtime"),
        _item("test_frameworks", "torch", "fw-base:r2", "cpu"),
        _item("test_runtime", "podman", "orphan:r3", "runtime"),
    ]
    config = _Config(report, "static,cpu")
    collection.deselect_derived_tiers(config, items, REFS)
    # the framework image keeps its cpu check; its parent and an image whose parent is not
    # tested in this run keep every tier
    assert [i.nodeid for i in items] == [
        "checks/test_runtime.py::podman[base:r1]",
        "checks/test_frameworks.py::torch[fw-base:r2]",
        "checks/test_runtime.py::podman[orphan:r3]",
    ]
    assert [i.nodeid for i in config.deselected] == ["checks/test_runtime.py::podman[fw-base:r2]"]
    assert "1 check(s) of fw-base:r2 deselected" in config.stash[collection.DERIVED_NOTE]
    assert "base:r1" in config.stash[collection.DERIVED_NOTE]


def test_derived_tiers_off_by_default_and_an_unknown_tier_is_a_usage_error(report):
    items = [_item("test_runtime", "podman", "fw-base:r2", "runtime")]
    collection.deselect_derived_tiers(_Config(report, None), items, REFS)
    assert len(items) == 1
    with pytest.raises(pytest.UsageError, match="unknown tier"):
        collection.deselect_derived_tiers(_Config(report, "static,quick"), items, REFS)
