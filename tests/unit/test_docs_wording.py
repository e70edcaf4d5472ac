"""The user docs' wording (README.md, docs/*.md, examples/): the project's terms are defined
before a reader meets them, no sentence says how the project was made instead of what is true
for the user, each placeholder has one spelling, and the figures the docs quote agree with the
generated source they come from (matrix.yaml's profiles, the catalogue docs/images.json).

Each test reports every finding at once (file:line), so a fix can be made in one pass.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainbase.define.matrix import load
from trainbase.render.figures import as_read

from .conftest import ROOT

README = ROOT / "README.md"
GLOSSARY = ROOT / "docs" / "glossary.md"
CATALOGUE_JSON = ROOT / "docs" / "images.json"

# The project's own words, each with the pattern of its use in prose. The glossary defines every
# one; README.md links the glossary before the first of them.
TERMS: dict[str, str] = {
    "cell": r"\bcells?\b",
    "row": r"\brows?\b",
    "profile": r"\bprofiles?\b",
    "tier": r"\btiers?\b",
    "parent": r"\bparents?\b",
    "level": r"(?<![\w-])level(?:s|\d)?\b(?! \d)",
    "immutable tag": r"\bimmutable tags?\b",
    "twin": r"\btwins?\b",
    "inbox": r"\binbox\b",
    "manifest": r"\bmanifests?\b",
    "catalogue": r"\bcatalogue\b",
    ".ci/run": r"\.ci/run\b",
}
# The words a page of docs/ uses in the project's own sense, which a reader arriving there from a
# search cannot guess: a page that uses one links the glossary before it (or at it).
PAGE_JARGON = ("row", "level", "twin", "inbox", ".ci/run")
# "in a row" (one after the other) is English, not the matrix's row
NOT_JARGON = re.compile(r"\bin a row\b|\btable rows?\b|\bone row per\b", re.I)

# Sentences about how the project was made rather than what holds for the user: "here" is no
# machine a reader knows, an issue number is no reason, a session is nobody's.
HOW_IT_WAS_MADE = [
    r"\b(?:tried|measured|tested|seen|unlocked|built|builds|buildable|installed|killed|ran|pulled)"
    r" here\b",
    r"\b(?:images?|hosts?|machines?) here\b",
    r"\b(?:run to run|reliably|mutated|that reason|from|\d+\.\d+) here\b",
    r"\(here, ",
    r"\bthis session\b",
    r"\bissues? #?\d+\b",
    r"\blent\b",
]

# One spelling per placeholder: the spelling the docs use, and the others it replaces.
# REGISTRY is --registry's value (HOST/NAMESPACE, e.g. ghcr.io/OWNER/trainbase), CELL a cell's
# name, rTAG its immutable tag, OWNER the GitHub owner, IMAGE any image reference, DIGEST a
# sha256 digest; pyxis (srun --container-image) spells the registry ghcr.io#OWNER/trainbase/.
PLACEHOLDERS: list[tuple[str, str]] = [
    (
        r"<registry>|\$REGISTRY\b|\bHOST/NS\b|registry\.example\.com|myregistry\.azurecr\.io",
        "REGISTRY, or myacr.azurecr.io for an Azure Container Registry",
    ),
    (r"REGISTRY#|#NAMESPACE/", "ghcr.io#OWNER/trainbase/CELL:rTAG (pyxis)"),
    (r"<owner>|<org>|(?<!/orgs/)\bORG\b", "OWNER"),
    (r"<tag>|\bRTAG\b|(?<![\w-])TAG-zstd|:TAG\b", "rTAG"),
    (r"<cell>|<cell name>|\bCELL_NAME\b|\bREGISTRY/NAME\b|\bNS/NAME\b", "CELL"),
    (r"<image>|(?<![$\w])IMG\b(?!=)", "IMAGE"),
    (r"<digest>", "DIGEST"),
]
# what may stand in angle brackets: HTML tags, and C++ headers named in a compiler's message
NOT_PLACEHOLDERS = {
    "br",
    "details",
    "summary",
    "sub",
    "sup",
    "code",
    "kbd",
    "b",
    "i",
    "p",
    "a",
    "em",
    "string",
    "mutex",
}
ANGLE_PLACEHOLDER = re.compile(r"<([a-z][a-z0-9 _./-]*)>")

GB = re.compile(r"(\d+(?:\.\d+)?) GB\b")
CELL_NAME = re.compile(r"`([a-z0-9.]+(?:-[a-z0-9.]+)+)`")


def user_docs() -> list[Path]:
    """What a user reads: README.md, docs/*.md but the generated catalogue, examples' *.md."""
    docs = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
    return [p for p in docs if p.name != "images.md"]


def example_files() -> list[Path]:
    """The examples a user copies: job files and scripts, whose comments are docs too."""
    kinds = {".yaml", ".yml", ".sbatch", ".sh", ".py"}
    return sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in kinds)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def without_cli_reference(text: str) -> str:
    """README.md's `## CLI` section blanked (line numbers kept): its tables spell build.py's
    options and outputs and are checked against build.py by test_docs.py."""
    m = re.search(r"^## CLI\n.*?(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return text
    return text[: m.start()] + re.sub(r"[^\n]", " ", m.group(0)) + text[m.end() :]


def in_code(text: str, pos: int) -> bool:
    """Inside an inline code span: a field or option name (`rows`, `--level`), not the word."""
    line_start = text.rfind("\n", 0, pos) + 1
    return text.count("`", line_start, pos) % 2 == 1


def first_use(text: str, pattern: str) -> int | None:
    is_path = pattern == TERMS[".ci/run"]
    for m in re.finditer(pattern, text, 0 if is_path else re.I):
        around = text[max(0, m.start() - 12) : m.end() + 12]
        if NOT_JARGON.search(around) or (not is_path and in_code(text, m.start())):
            continue
        return m.start()
    return None


def glossary_link(text: str, glossary_href: str) -> int | None:
    """Where the first link to the glossary starts (its text may be the term it defines)."""
    m = re.search(r"\[[^\]\n]*\]\(" + re.escape(glossary_href) + r"(?:#[\w-]*)?\)", text)
    return m.start() if m else None


# --------------------------------------------------------------------------- 1. terms


def glossary_entries() -> set[str]:
    """The terms docs/glossary.md defines: `- **term**` or `**`term`**` items and headings."""
    text = GLOSSARY.read_text()
    found = {m.group(1).strip("`").lower() for m in re.finditer(r"^- \*\*(.+?)\*\*", text, re.M)}
    found |= {m.group(1).strip("`").lower() for m in re.finditer(r"^#{2,4} (.+)$", text, re.M)}
    return found


def test_the_glossary_defines_every_term_of_the_project() -> None:
    assert GLOSSARY.is_file(), "docs/glossary.md: missing (the project's terms, one definition each)"
    missing = [t for t in TERMS if t.lower() not in glossary_entries()]
    assert not missing, f"docs/glossary.md defines no entry for: {missing}"


def test_the_readme_links_the_glossary_before_the_first_term() -> None:
    text = README.read_text()
    link = glossary_link(text, "docs/glossary.md")
    assert link is not None, "README.md: no link to docs/glossary.md"
    # the paragraph that links the glossary may name the terms it defines
    paragraph = text.rfind("\n\n", 0, link)
    early = []
    for term, pattern in TERMS.items():
        pos = first_use(text, pattern)
        if pos is not None and pos < paragraph:
            early.append(
                f"README.md:{line_of(text, pos)}: {term!r} used before the glossary link (line {line_of(text, link)})"
            )
    assert not early, "\n".join(early)


def jargon_before_glossary() -> list[str]:
    problems = []
    for doc in user_docs():
        if doc in (README, GLOSSARY):
            continue
        text = doc.read_text()
        href = "glossary.md" if doc.parent == ROOT / "docs" else "../docs/glossary.md"
        link = glossary_link(text, href)
        for term in PAGE_JARGON:
            pos = first_use(text, TERMS[term])
            if pos is not None and (link is None or pos < link):
                problems.append(f"{rel(doc)}:{line_of(text, pos)}: {term!r} before any link to the glossary")
    return problems


def test_each_page_links_the_glossary_before_its_jargon() -> None:
    problems = jargon_before_glossary()
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 2. how it was made


def how_it_was_made() -> list[str]:
    problems = []
    for doc in [*user_docs(), *example_files(), ROOT / "docs" / "images.md"]:
        text = doc.read_text()
        for pattern in HOW_IT_WAS_MADE:
            for m in re.finditer(pattern, text, re.I):
                problems.append(f"{rel(doc)}:{line_of(text, m.start())}: {m.group(0)!r}")
    return sorted(problems)


def test_no_words_of_how_the_project_was_made() -> None:
    problems = how_it_was_made()
    assert not problems, "say which machine, profile and date instead:\n" + "\n".join(problems)


# --------------------------------------------------------------------------- 3. placeholders


def placeholder_spellings() -> list[str]:
    problems = []
    # the glossary's table of placeholders names the spellings it defines
    for doc in [*(p for p in user_docs() if p != GLOSSARY), *(p for p in example_files() if p.suffix != ".py")]:
        text = doc.read_text()
        if doc == README:
            text = without_cli_reference(text)
        named = set()
        for pattern, spelling in PLACEHOLDERS:
            for m in re.finditer(pattern, text):
                named.add(m.start())
                problems.append(f"{rel(doc)}:{line_of(text, m.start())}: {m.group(0)!r} (spelled {spelling})")
        for m in ANGLE_PLACEHOLDER.finditer(text):
            if m.group(1) not in NOT_PLACEHOLDERS and m.start() not in named:
                problems.append(f"{rel(doc)}:{line_of(text, m.start())}: {m.group(0)!r} (an UPPER-CASE word, no <...>)")
    return sorted(set(problems))


def test_each_placeholder_has_one_spelling() -> None:
    problems = placeholder_spellings()
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 4. figures


@pytest.fixture(scope="module")
def profile_counts() -> dict[str, int]:
    m = load(ROOT / "matrix.yaml")
    return {p: sum(1 for c in m.included if p in c.profiles) for p in m.spec.profiles}


def profile_figures(counts: dict[str, int], texts: list[tuple[str, str]]) -> list[str]:
    """ "the `ci` profile's 4 Debian cells", "`production` (148 cells)": the count of its cells."""
    names = "|".join(map(re.escape, counts))
    quoted = re.compile(r"`(" + names + r")`(?:\*\*)?(?: profile)?[^.`;]{0,40}?\b(\d+) (?:\w+ )?cells\b")
    problems = []
    for doc, text in texts:
        for m in quoted.finditer(text):
            if int(m.group(2)) != counts[m.group(1)]:
                problems.append(
                    f"{doc}:{line_of(text, m.start())}: {m.group(0)!r}: the profile has {counts[m.group(1)]} cells"
                )
    return problems


def test_each_profile_size_quoted_is_the_matrixs(profile_counts: dict[str, int]) -> None:
    problems = profile_figures(profile_counts, [(rel(doc), as_read(doc.read_text())) for doc in user_docs()])
    assert not problems, "\n".join(problems)


def test_a_stale_profile_size_is_found(profile_counts: dict[str, int]) -> None:
    # README.md as of 3539e6d, which gave the ci profile 3 cells when it had 4
    stale = "the framework images (the `ci` part, 3 base cells: 10m10s, dominated by compiling Open MPI"
    assert profile_figures(profile_counts, [("README.md", stale)]) != []


def test_the_matrix_size_quoted_is_the_matrixs() -> None:
    m = load(ROOT / "matrix.yaml")
    text = as_read(README.read_text())
    quoted = re.search(r"Today's matrix: (\d+) cells", text)
    assert quoted, "README.md no longer says the matrix's size: drop this test or the figure's source"
    assert int(quoted.group(1)) == len(m.included)


def catalogue_sizes() -> dict[str, str]:
    doc = json.loads(CATALOGUE_JSON.read_text())
    return {r["name"]: f"{r['built']['size_bytes'] / 1e9:.2f}" for r in doc["images"] if r.get("built")}


def size_figures() -> list[str]:
    """A size quoted on the same line as a full cell name the catalogue measured is the catalogue's."""
    sizes = catalogue_sizes()
    problems = []
    for doc in user_docs():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            names = [n for n in CELL_NAME.findall(line) if n in sizes]
            quoted = GB.findall(line)
            if len(names) == 1 and quoted and quoted[0] != sizes[names[0]]:
                problems.append(
                    f"{rel(doc)}:{number}: {names[0]} quoted at {quoted[0]} GB, the catalogue says {sizes[names[0]]} GB"
                )
    return problems


def test_each_image_size_quoted_is_the_catalogues() -> None:
    assert catalogue_sizes(), "docs/images.json records no measured size: nothing to compare"
    problems = size_figures()
    assert not problems, "\n".join(problems)


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_each_link_into_the_catalogue_names_a_heading_it_has() -> None:
    # the README's answer for a cluster points into the generated catalogue by a heading's anchor,
    # which moves when the generator's grouping does
    headings = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", (ROOT / "docs" / "images.md").read_text(), re.M)}
    problems = []
    for doc in user_docs():
        text = doc.read_text()
        for m in re.finditer(r"\]\((?:docs/|\.\./docs/)?images\.md#([\w-]+)\)", text):
            if m.group(1) not in headings:
                problems.append(f"{rel(doc)}:{line_of(text, m.start())}: images.md#{m.group(1)}: no such heading")
    assert not problems, "\n".join(problems)
