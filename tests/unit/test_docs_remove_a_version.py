"""docs/matrix.md's "Remove a version", walked on a copy of the checkout as the page says it
(issue 65): delete the version from `axes`, run `build.py lock` (offline: nothing new to
resolve), delete what its warnings name, run it again; then `check` passes -- the images, pip
locks and bases of the version gone, and the docs' figures and examples rewritten -- with no
hand edit outside matrix.yaml. The version is found in the matrix (the newest CUDA), never
named here."""

from __future__ import annotations

import re
import shutil

import yaml

from trainbase.define.matrix import load
from trainbase.render import figures

from .conftest import ROOT, run_cli

LEFTOVER = re.compile(r"leftover of a dropped version: (?P<where>\S+?):? (?P<what>.*)")


def _page_says() -> str:
    text = (ROOT / "docs" / "matrix.md").read_text()
    return text[text.index("## Remove a version") :]


def test_the_page_names_one_command(capsys):
    page = " ".join(_page_says().split())
    assert "Delete it from `axes`, then run one command, offline: `.venv/bin/python build.py lock`" in page
    assert "drops the bases no cell uses from `locks/bases.json`" in page


def test_remove_the_newest_cuda_as_the_page_says(workdir, capsys):
    for entry in figures.DOCS:  # the docs beside the scratch matrix: their figures must follow
        src = ROOT / entry
        if src.is_dir():
            shutil.copytree(src, workdir / entry)
        elif src.exists():
            shutil.copy2(src, workdir / entry)
    path, arg = workdir / "matrix.yaml", ["--file", str(workdir / "matrix.yaml")]
    data = yaml.safe_load(path.read_text())
    named = " ".join(c for p in data["profiles"].values() for c in p.get("cells") or [])
    gone = next((c for c in reversed(data["axes"]["cuda"]) if f"-cuda{c}-" not in named), None)
    assert gone, "every CUDA of the axis has a cell a profile names by hand"
    before = load(path)
    bases_before = set(yaml.safe_load((workdir / "locks" / "bases.json").read_text())["bases"])

    # 1. the one edit the page asks for: the axis value (a text edit: comments stay)
    text = path.read_text()
    axis = re.search(r"^  cuda: \[.*\]$", text, re.M)
    assert axis, "axes.cuda is no longer a one-line list"
    path.write_text(text.replace(axis[0], axis[0].replace(f'"{gone}", ', "").replace(f', "{gone}"', ""), 1))

    # 2. `lock`: renders, removes the locks and bases no cell uses, names every leftover
    code, out, err = run_cli(["lock", *arg], capsys)
    assert code == 0, err
    leftovers = [LEFTOVER.search(line) for line in err.splitlines() if "leftover of a dropped version" in line]
    assert leftovers and all(leftovers), err
    assert any(m["where"] == f"cuda.{gone}" for m in leftovers if m), err

    # 3. delete what it names, then `lock` again: nothing left to say
    data = yaml.safe_load(path.read_text())
    data["cuda"].pop(gone)
    for table in data["frameworks"].values():
        for r in table.get("releases") or []:
            r["cuda"] = [c for c in r["cuda"] if c != gone]
        if "releases" in table:
            table["releases"] = [r for r in table["releases"] if r["cuda"]]
    data["holds"] = [h for h in data.get("holds") or [] if h.get("where") != f"cuda.{gone}"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli(["lock", *arg], capsys)
    assert code == 0 and "leftover" not in err, err

    # 4. `check`: images/, locks/, bases.json and the docs all follow the matrix
    code, out, err = run_cli(["check", *arg], capsys)
    assert code == 0, err
    after = load(path)
    assert len(after.included) < len(before.included)
    assert not any(f"-cuda{gone}-" in d.name for d in (workdir / "images").iterdir())
    assert not any(f"cuda{gone}" in p.name for p in (workdir / "locks").glob("*.txt"))
    bases_after = set(yaml.safe_load((workdir / "locks" / "bases.json").read_text())["bases"])
    assert bases_after <= bases_before and not any(f":{gone}." in b for b in bases_after)
    readme = figures.as_read((workdir / "README.md").read_text())
    assert f"Today's matrix: {len(after.included)} cells" in readme
