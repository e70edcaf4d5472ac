"""The counts in the docs' prose follow the matrix (issue 65): adding a CUDA row once needed 8
hand-edited numbers in README.md and docs/quickstart.md, and nothing noticed them going stale.
Each count now stands between `<!--fig:NAME-->` markers that `render` rewrites and `check`
compares (trainbase/render/figures.py). The values here are computed, never typed."""

from __future__ import annotations

import re

import yaml

from trainbase.define.matrix import load
from trainbase.render import figures

from .conftest import ROOT, run_cli


def _marked(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for m in figures.MARK.finditer(text):
        found.setdefault(m["name"], []).append(m["value"])
    return found


def test_every_figure_in_the_checkout_is_the_matrixs():
    m = load(ROOT / "matrix.yaml")
    assert figures.check(m, ROOT) == []
    table = figures.figures(m)
    named = {n for p in figures.doc_files(ROOT) for n in _marked(p.read_text())}
    assert {"cells", "excluded", "profile.production.cells", "profile.local.images"} <= named
    for path in figures.doc_files(ROOT):
        for name, values in _marked(path.read_text()).items():
            assert values == [str(table[name]())] * len(values), (path, name)


def test_the_sentences_about_todays_matrix_carry_no_typed_count():
    """The sentences that describe the matrix as it is today hold their numbers in markers only
    (past measurements, with their date, stay typed: they are facts about a run)."""
    for path in figures.doc_files(ROOT):
        assert not typed_counts(path.read_text()), path.relative_to(ROOT)


TODAY = re.compile(r"(?:Today's matrix:|Today the `local` profile has|The `local` profile has)(?:[^.]|\.(?!\s))*")
NOT_A_COUNT = re.compile(
    r"(?:(?:Debian|Ubuntu|linux/amd|linux/arm|arm|amd|sm_|R)\s?)\d+(?:\.\d+)*"  # an OS, platform, GPU, driver
    r"|\d+(?:\.\d+)+"  # a version: 24.04, 12.8
)


def typed_counts(text: str) -> list[str]:
    """The numbers typed outside markers in the sentences that describe today's matrix
    (versions, OS releases and platform names are not counts)."""
    found = []
    for sentence in TODAY.finditer(text):
        found += re.findall(r"\b\d+\b", NOT_A_COUNT.sub("", figures.MARK.sub("", sentence[0])))
    return found


def test_the_guard_finds_a_typed_count():
    readme = (ROOT / "README.md").read_text()
    assert typed_counts(readme) == []
    typed = figures.MARK.sub(lambda m: m["value"], readme)  # every marker removed, numbers kept
    m = load(ROOT / "matrix.yaml")
    table = figures.figures(m)
    want = [str(table[n]()) for n in ("cells", "cells.amd64", "production.amd64", "cells.amd64.debian", "cells.arm64")]
    assert typed_counts(typed)[:5] == want


def test_a_dropped_version_makes_check_name_each_stale_figure_and_render_fix_it(workdir, capsys):
    for entry in figures.DOCS:  # the docs as they stand, beside the scratch matrix
        src = ROOT / entry
        if src.is_dir():
            for p in src.rglob("*.md"):
                (workdir / p.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
                (workdir / p.relative_to(ROOT)).write_text(p.read_text())
        else:
            (workdir / entry).write_text(src.read_text())
    path = workdir / "matrix.yaml"
    before = figures.figures(load(path))["cells"]()
    data = yaml.safe_load(path.read_text())
    gone = data["axes"]["cuda"][-1]  # the newest: no profile names its cells by hand
    data["axes"]["cuda"].remove(gone)
    for profile in data["profiles"].values():
        profile["cells"] = [c for c in profile.get("cells") or [] if f"-cuda{gone}-" not in c] or profile.get("cells")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    after = figures.figures(load(path))["cells"]()
    assert after < before

    code, out, err = run_cli(["check", "--file", str(path)], capsys)
    assert code == 1
    stale = [line for line in err.splitlines() if "figure cells says" in line]
    assert stale and all(f"says {before}, the matrix has {after}" in line for line in stale), err
    assert re.search(r"figures: README\.md:\d+: figure cells says", err), err

    run_cli(["render", "--file", str(path)], capsys)
    assert _marked((workdir / "README.md").read_text())["cells"] == [str(after)]
    code, out, err = run_cli(["check", "--file", str(path)], capsys)
    assert "figure" not in err, err


def test_a_marker_naming_no_figure_is_an_error_naming_the_file_and_line(workdir, capsys):
    (workdir / "README.md").write_text("intro\n\nWe build <!--fig:cels-->3<!--/fig--> cells.\n")
    code, out, err = run_cli(["check", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 1 and "figures: README.md:3: no figure named 'cels'" in err, err
    code, out, err = run_cli(["render", "--file", str(workdir / "matrix.yaml")], capsys)
    assert code == 2 and "no figure named 'cels'" in err


def test_a_profiles_images_count_its_parents():
    m = load(ROOT / "matrix.yaml")
    table = figures.figures(m)
    for name in m.spec.profiles:
        cells = [c for c in m.included if name in c.profiles]
        parents = {c.parent for c in cells if c.parent} - {c.name for c in cells}
        assert table[f"profile.{name}.images"]() >= table[f"profile.{name}.cells"]() == len(cells)
        if not parents:
            continue
        assert table[f"profile.{name}.images"]() > len(cells), name
