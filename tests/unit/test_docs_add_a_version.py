"""docs/matrix.md's "Add a CUDA version" and "Add a framework release", followed as written in a
scratch copy: the entries the page shows are accepted by the schema as they stand, a CUDA row and
a release made from them get their cells and tags, and the render names the one command left
(`build.py lock`). The page cannot drift from the
schema again (a user once met a documented entry the schema refused)."""

from __future__ import annotations

import json
import re

import yaml

from .conftest import ROOT, run_cli

MARK = re.compile(r"<!-- matrix-entry: (?P<where>[\w.]+) -->\s*```yaml\n(?P<body>.*?)```", re.S)


def _documented_entries() -> dict[str, list]:
    text = (ROOT / "docs" / "matrix.md").read_text()
    return {m["where"]: yaml.safe_load(m["body"]) for m in MARK.finditer(text)}


def test_the_page_shows_a_framework_release_entry():
    entries = _documented_entries()
    assert "frameworks.pytorch.releases" in entries, "docs/matrix.md lost its example release entry"
    [entry] = entries["frameworks.pytorch.releases"]
    assert {"version", "cuda", "nccl", "packages", "size_increment_gb", "patch"} <= set(entry)


def _new_release() -> dict:
    """A release that does not exist yet, made from the documented one by changing its version."""
    [entry] = _documented_entries()["frameworks.pytorch.releases"]
    return dict(
        entry, version="2.15.9", packages=[p.replace("torch==2.15.0", "torch==2.15.9") for p in entry["packages"]]
    )


def test_a_second_release_for_the_same_cuda_is_refused_naming_both(workdir, capsys):
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    data["frameworks"]["pytorch"]["releases"].append(_new_release())
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli(["list", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and "releases[2.15.9].cuda: CUDA 13.2 is already release 2.15.0's" in err, out + err


def test_a_release_whose_torch_pin_moved_without_its_version_is_refused(workdir, capsys):
    """What a search-and-replace of `torch==` (or a `--bump torch`) does to a release entry:
    the image would carry PyTorch 2.15.0 under 2.9.1's name, CUDA rows and NCCL. Refused."""
    path = workdir / "matrix.yaml"
    path.write_text(path.read_text().replace("torch==2.14.1", "torch==2.15.0"))
    code, out, err = run_cli(["list", "--file", str(path)], capsys)
    assert code == 2 and "releases[2.14.1].packages: torch==2.15.0, but the release is 2.14.1" in err, out + err


def test_a_release_added_as_the_page_says_gets_cells_and_waits_only_for_the_lock(workdir, capsys):
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    releases = data["frameworks"]["pytorch"]["releases"]
    # the page: the newer release takes its CUDA from the one before it (here: replaces it), and
    # the releases built on it follow (Horovod, DeepSpeed `requires`)
    old = next(r for r in releases if r["version"] == "2.15.0")
    releases[releases.index(old)] = _new_release()
    for fw in ("horovod", "deepspeed"):
        for r in data["frameworks"][fw]["releases"]:
            if r.get("requires", {}).get("pytorch") == "2.15.0":
                r["requires"]["pytorch"] = "2.15.9"
    for profile in data["profiles"].values():
        if "cells" in profile:
            profile["cells"] = [c.replace("pytorch2.15.0", "pytorch2.15.9") for c in profile["cells"]]
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    code, out, err = run_cli(
        ["list", "--json", "--select", "framework=pytorch", "--file", str(workdir / "matrix.yaml")], capsys
    )
    assert code == 0, err
    new = [c for c in json.loads(out)["cells"] if c["framework_version"] == "2.15.9"]
    assert new and all(c["tag"] for c in new), "the documented entry made no cells"
    assert any(c["axes"]["os"] == "debian12" for c in new)

    code, out, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code != 0 and "pytorch2.15.9" in out + err and "build.py lock" in out + err, out + err


def test_a_cuda_row_added_as_the_page_says_gets_cells_and_waits_only_for_the_lock(workdir, capsys):
    entries = _documented_entries()
    assert "cuda" in entries, "docs/matrix.md lost its example CUDA row"
    [(shown, row)] = entries["cuda"].items()
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    assert row == yaml.safe_load(yaml.safe_dump(data["cuda"][shown])), "the page's CUDA row is not matrix.yaml's"
    # step 1-3: a new version on the axis, its row (a copy, as the page says), and the release
    # whose wheels are built for it
    data["axes"]["cuda"].append("13.9")
    data["cuda"]["13.9"] = dict(row, toolkit="13.9.0")
    release = next(r for r in data["frameworks"]["pytorch"]["releases"] if shown in r["cuda"])
    release["cuda"].append("13.9")
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    code, out, err = run_cli(
        ["list", "--json", "--select", "cuda=13.9", "--file", str(workdir / "matrix.yaml")], capsys
    )
    assert code == 0, err
    cells = json.loads(out)["cells"]
    assert {c["axes"]["framework"] for c in cells} >= {"none", "pytorch"} and all(c["tag"] for c in cells)
    code, out, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code != 0 and "cuda13.9" in out + err and "build.py lock" in out + err, out + err
