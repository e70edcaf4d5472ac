"""What the README says `.ci/run` runs on which cell is what its plan runs (issue 73): the tiers
of the base images (every tier but the hardware ones, which skip without a GPU or an RDMA
device), the framework image's derived tiers (scripts/test.sh's --derived-tiers default), and the
`ci` profile's shape the sentence speaks of (one framework image, built FROM one of its bases)."""

from __future__ import annotations

import re

from trainbase.define.matrix import load
from trainbase_conformance import TIERS

from .conftest import ROOT

HARDWARE = {"gpu", "fabric"}  # skip on the 2-core runner: no GPU, no /dev/infiniband
SENTENCE = re.compile(
    r"runs the ([a-z, ]+?) tiers on its base images, and the ([a-z, ]+?) tiers on the\s+framework image built FROM one"
)


def tiers(words: str) -> set[str]:
    return {t.strip() for t in re.split(r",|\band\b", words) if t.strip()}


def plan() -> tuple[set[str], set[str]]:
    """(the tiers the gate's engine stage runs on a base image, those it runs on a derived one)."""
    test_sh = (ROOT / "scripts/test.sh").read_text()
    m = re.search(r'--derived-tiers "\$\{TRAINBASE_DERIVED_TIERS:-([a-z,]+)\}"', test_sh)
    assert m, "scripts/test.sh no longer passes --derived-tiers with a default: update this test and the README"
    # the engine stage selects no tier (its only marker expression is "not slow"): every tier is
    # collected on a base image
    stage = next(ln for ln in test_sh.splitlines() if "--junitxml=reports/junit.xml" in ln)
    assert " -m " not in stage.split(" pytest ", 1)[1], stage
    markers = re.findall(r'pytest_args\+=\([^)]*-m "([^"]*)"', test_sh)
    assert markers == ["not slow"], markers
    return set(TIERS) - HARDWARE, set(m.group(1).split(","))


def test_the_readme_says_which_tiers_ci_runs_on_which_cell():
    text = " ".join((ROOT / "README.md").read_text().split())
    m = SENTENCE.search(text)
    assert m, "README.md no longer says which tiers .ci/run runs on its base and framework images"
    base, derived = plan()
    assert tiers(m.group(1)) == base, (m.group(1), sorted(base))
    assert tiers(m.group(2)) == derived, (m.group(2), sorted(derived))


def test_the_ci_profile_is_bases_and_one_framework_image_on_one_of_them():
    m = load(ROOT / "matrix.yaml")
    cells = m.select(profile="ci")
    frameworks = [c for c in cells if c.framework != "none"]
    assert len(frameworks) == 1, [c.name for c in frameworks]
    assert frameworks[0].parent in {c.name for c in cells if c.framework == "none"}
