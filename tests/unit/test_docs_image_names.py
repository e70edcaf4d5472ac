"""Every image name the docs and examples show resolves to a cell the matrix builds (issue 55):
a reader who copies `image: .../pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-ubuntu24.04:rTAG`
from an example must get an image that exists, not a combination the matrix refuses.

Names are found wherever they stand: prose, tables, YAML, `docker run` lines. Allowed besides
the built cells (images/), each for its reason:
- after `--explain`: the command exists to say why a cell is refused (test_docs checks the name);
- Azure ML's own images (the foreign image the suite is run on): `mcr.microsoft.com/azureml/...`
  or a name of tests/foreign/;
- a name pinned to an immutable tag (`NAME:r<12 hex>`): a measurement of that exact recipe, a
  fact about the past (docs/performance.md's tables), not an image to pick.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from .conftest import ROOT
from .test_docs import user_docs

V = r"\d+(?:\.\d+)*"
# [framework[-framework]-]MPI-[doca-]cuda-cudnn-os[-arm64]
NAME = re.compile(
    rf"(?<![\w.-])((?:[a-z]+{V}-){{0,2}}(?:openmpi|intelmpi){V}-(?:doca{V}-)?cuda{V}-cudnn\d+-"
    rf"(?:ubuntu|debian){V}(?:-arm64)?)(?![\w-])"
)
# a name shortened with an ellipsis: `openmpi4.1.4-...-ubuntu22.04`, `pytorch2.15.0-openmpi5.0.11-...`
ELIDED = re.compile(rf"(?<![\w.-])((?:[a-z]+{V}-)+)(?:\.\.\.|…)(-(?:[a-z]+{V}-?)+(?:-arm64)?)?(?![\w-])")
AZURE = "mcr.microsoft.com/azureml/"
EXAMPLE_SUFFIXES = {".md", ".yml", ".yaml", ".sh", ".py", ".json", ".txt", ".sbatch", ".def", ""}


def built_cells() -> set[str]:
    return {p.name for p in (ROOT / "images").iterdir() if (p / "Dockerfile").is_file()}


def foreign_names() -> set[str]:
    return {p.name.removeprefix("azureml-") for p in (ROOT / "tests" / "foreign").iterdir() if p.is_dir()}


def documents() -> list[Path]:
    examples = [p for p in (ROOT / "examples").rglob("*") if p.is_file() and p.suffix in EXAMPLE_SUFFIXES]
    return sorted(set(user_docs()) | set(examples))


def name_problems(text: str, built: set[str], foreign: set[str]) -> list[str]:
    """`line: name: why` for each name in ``text`` that is no built cell and not allowed above."""
    out = []
    for m in NAME.finditer(text):
        name, before = m.group(1), text[max(0, m.start() - 40) : m.start()]
        after = text[m.end() : m.end() + 14]
        if (
            name in built
            or re.search(r"(?:--|build\.py )explain\s*$", before)
            or before.endswith(AZURE)
            or name in foreign
            or re.match(r":r[0-9a-f]{12}\b", after)
        ):
            continue
        line = text.count("\n", 0, m.start()) + 1
        out.append(f"{line}: {name}: no cell the matrix builds (`build.py explain {name}` says why)")
    for m in ELIDED.finditer(text):
        head, tail = m.group(1), (m.group(2) or "")
        if not re.search(r"(openmpi|intelmpi|pytorch|tensorflow|horovod|deepspeed|cuda)\d", head + tail):
            continue
        pattern = head + "*" + tail
        if not any(fnmatch.fnmatchcase(c, pattern) for c in built):
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{line}: {m.group(0)}: matches no cell the matrix builds")
    return out


def test_every_image_name_in_the_docs_and_examples_is_a_cell_the_matrix_builds():
    built, foreign = built_cells(), foreign_names()
    assert len(built) > 100, "images/ holds the rendered cells: none found"
    problems = [
        f"{doc.relative_to(ROOT)}:{p}"
        for doc in documents()
        for p in name_problems(doc.read_text(errors="replace"), built, foreign)
    ]
    assert not problems, "\n".join(problems)


def test_the_scan_finds_a_refused_name_in_yaml_prose_and_shell_and_an_elided_one():
    built = {"pytorch2.15.0-openmpi5.0.10-cuda13.2-cudnn9-ubuntu24.04", "openmpi4.1.8-cuda12.8-cudnn9-ubuntu22.04"}
    text = (
        "image: ghcr.io/OWNER/trainbase/pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-ubuntu24.04:rTAG\n"
        "Pick `pytorch2.15.0-openmpi5.0.10-cuda13.2-cudnn9-ubuntu24.04` for Azure ML.\n"
        "docker run --rm trainbase/openmpi4.1.4-cuda12.8-cudnn9-ubuntu22.04 true\n"
        "see `openmpi4.1.4-...-ubuntu22.04` and `openmpi4.1.8-…-ubuntu22.04`\n"
        "build.py --explain openmpi4.1.4-cuda12.8-cudnn9-ubuntu22.04\n"
        "build.py explain openmpi4.1.4-cuda12.8-cudnn9-ubuntu22.04\n"
        "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04\n"
        "| pytorch2.9.1-openmpi4.1.4-cuda12.8-cudnn9-debian12:r54645df7f127 | gzip |\n"
    )
    found = name_problems(text, built, set())
    assert [p.split(":")[0] for p in found] == ["1", "3", "4"], found
    assert "pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-ubuntu24.04" in found[0]
    assert "openmpi4.1.4-...-ubuntu22.04" in found[2]
