"""Every conformance check, and how it is shown to fail: the table in docs/conformance.md.

A check that has never been seen failing may be unable to fail. Each check is shown failing in one or
more of these ways:

* ``variant``: a broken image in tests/conformance/broken/ whose expect.json claims the check, with the
  pattern its failure message must match (test_broken_variants.py builds it and runs the check);
* ``unit``: a test under tests/unit that makes the check, or the function its verdict comes from, fail
  on fake input, without Docker;
* ``foreign``: an image trainbase did not build (tests/foreign/*/outcomes.json) on which the check
  is recorded as failing, with the reason.

Variant and foreign entries are read from expect.json and outcomes.json; tests/conformance/failures.yaml
holds the rest: a ``unit`` entry (the test's node id and the message) or a ``none`` entry that says why
no failure is shown yet. The checks are the ``test_*`` functions of trainbase_conformance/checks (a
parametrized check is one check), each with its tier marker. tests/unit/test_failure_table.py fails when
a check has no entry, when an entry names no check, no test or no variant, and when the table in the docs
is not what this writes.

    .venv/bin/python -m tests.conformance.failures           # write the table into docs/conformance.md
    .venv/bin/python -m tests.conformance.failures --check   # exit 1 if the docs' table is out of date
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conformance import verdict
from trainbase_conformance import TIERS
from trainbase_conformance.resources import CHECKS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BROKEN = HERE / "broken"
FOREIGN = ROOT / "tests" / "foreign"
DATA = HERE / "failures.yaml"
DOC = ROOT / "docs" / "conformance.md"
START, END = "<!-- failures-table:start -->", "<!-- failures-table:end -->"
GENERATOR = ".venv/bin/python -m tests.conformance.failures"
MATRIX = ROOT / "matrix.yaml"
CI_PROFILE = "ci"  # the profile .ci/run builds, and the self-test builds its variants FROM
MUTATION_RECORD = HERE / "mutation-record.json"
# A foreign image's recorded failure whose message is one of these failed before the check's own
# asserts ran (a precondition many checks share): listed, not counted as the check shown failing.
PRECONDITIONS = {
    r"mpirun has detected an attempt to run as root": "its mpirun refuses root before the check's own asserts run",
    r"but \S+ declares no '[\w.]+'": "its expectations file does not declare a component the image holds, which "
    "stops the check before its own asserts run",
}
KINDS = ("variant", "unit", "foreign")  # the ways, strongest first: a check counts under the first it has
ENTRY_KEYS = {"unit": {"shown_by", "unit", "message", "via", "also"}, "none": {"shown_by", "why"}}


@dataclass(frozen=True)
class Check:
    """One conformance check: ``id`` is FILE::FUNCTION, as in failures.yaml."""

    id: str
    file: str
    name: str
    tier: str
    line: int


@dataclass(frozen=True)
class Way:
    """One way a check is shown failing: ``source`` is the variant's folder, the unit test's node id or
    the foreign image's folder; ``message`` the pattern (variant), the text (unit) or the recorded reason
    (foreign); ``note`` what the variant plants or the logic the unit test drives."""

    check: str
    kind: str
    source: str
    message: str
    note: str = ""
    uncounted: str = ""  # why this way does not count as the check shown failing ("" where it counts)


# --------------------------------------------------------------------------- the checks


def _marks(obj) -> list:
    marks = getattr(obj, "pytestmark", [])
    return list(marks) if isinstance(marks, (list, tuple)) else [marks]


def collect_checks(
    checks_dir: Path = CHECKS, package: str = "trainbase_conformance.checks"
) -> tuple[dict[str, Check], list[str]]:
    """Every ``test_*`` function of the check modules (imported, so that marks applied any way
    count), with its tier; the problems: a check without exactly one tier marker."""
    out, problems = {}, []
    for path in sorted(checks_dir.glob("test_*.py")):
        module = importlib.import_module(f"{package}.{path.stem}")
        for name, fn in vars(module).items():
            if not (name.startswith("test_") and inspect.isfunction(fn) and fn.__module__ == module.__name__):
                continue
            tiers = sorted({m.name for m in _marks(fn) + _marks(module) if m.name in TIERS})
            cid = f"{path.name}::{name}"
            if len(tiers) != 1:
                problems.append(f"{cid}: {len(tiers)} tier markers {tiers}, want one of {', '.join(TIERS)}")
                continue
            out[cid] = Check(cid, path.name, name, tiers[0], fn.__code__.co_firstlineno)
    return out, problems


# --------------------------------------------------------------------------- the ways


def ci_builds(matrix: Path = MATRIX, profile: str = CI_PROFILE) -> tuple[set[str], set[str]]:
    """The frameworks and MPI kinds of the images the ``ci`` profile builds (the bases the self-test
    in .ci/run builds its variants FROM)."""
    from trainbase.define import matrix as m

    cells = m.load(matrix).select(profile=profile)
    return ({c.framework for c in cells if c.framework != "none"}, {re.sub(r"[\d.]+$", "", c.mpi) for c in cells})


def variant_ways(
    checks: dict[str, Check], broken: Path = BROKEN, built: tuple[set[str], set[str]] | None = None
) -> tuple[list[Way], list[str]]:
    """expect.json's must_fail of every broken variant, each check resolved to the file of
    ``paths`` that defines it. A variant that needs a framework or MPI no image of the ``ci``
    profile has is built nowhere CI runs it (test_broken_variants.py skips it): its ways are
    listed, not counted."""
    frameworks, mpis = built if built is not None else ci_builds()
    ways, problems = [], []
    for folder in sorted(p for p in broken.iterdir() if (p / "expect.json").exists()):
        if not (folder / "Dockerfile").exists():
            problems.append(f"variant {folder.name}: an expect.json without a Dockerfile")
            continue
        expect = json.loads((folder / "expect.json").read_text())
        needs = [
            f"a {expect['framework']} image"
            for _ in [0]
            if expect.get("framework") and expect["framework"] not in frameworks
        ]
        needs += [f"an {expect['mpi']} image" for _ in [0] if expect.get("mpi") and expect["mpi"] not in mpis]
        unbuilt = (
            (
                f"not built by CI: it needs {' and '.join(needs)}, which the {CI_PROFILE} profile does not build "
                "(test_broken_variants.py skips it)"
            )
            if needs
            else ""
        )
        # must_fail: judged by the self-test on any engine; gpu_must_fail: by a GPU runner
        # (scripts/gpu-variants.sh in gpu.yml), on the checks of the gpu tier
        for key, paths_key, where in (
            ("must_fail", "paths", ""),
            (verdict.GPU_CLAIMS, "gpu_paths", "on a GPU runner: "),
        ):
            if key != "must_fail" and key not in expect:
                continue
            try:
                expected = verdict.expectations(expect, key)
            except ValueError as e:
                problems.append(f"variant {folder.name}: {e}")
                continue
            for name, e in expected.items():
                found = [f"{p}::{name}" for p in expect.get(paths_key, []) if f"{p}::{name}" in checks]
                if len(found) != 1:
                    problems.append(
                        f"variant {folder.name} claims {name}, which {len(found)} of its {paths_key} "
                        f"{expect.get(paths_key)} define"
                    )
                    continue
                ways.append(
                    Way(
                        found[0],
                        "variant",
                        folder.name,
                        e.pattern,
                        where + e.why,
                        unbuilt if key == "must_fail" else "",
                    )
                )
    return ways, problems


def foreign_ways(checks: dict[str, Check], foreign: Path = FOREIGN) -> tuple[list[Way], list[str]]:
    """The recorded failures of the images trainbase did not build (outcomes.json's must_fail:
    ``module::check`` -> the pattern its message must match, and why it fails)."""
    ways, problems = [], []
    for path in sorted(foreign.glob("*/outcomes.json")):
        for name, spec in (json.loads(path.read_text()).get("must_fail") or {}).items():
            why = spec if isinstance(spec, str) else spec.get("message", "")
            module, _, fn = name.partition("::")
            cid = f"{module}.py::{fn}"
            if cid not in checks:
                problems.append(f"foreign {path.parent.name}: {name} is no check")
                continue
            pre = next((w for pat, w in PRECONDITIONS.items() if re.search(pat, why)), "")
            ways.append(Way(cid, "foreign", path.parent.name, why, uncounted=pre and f"a shared precondition: {pre}"))
    return ways, problems


def load_entries(path: Path = DATA) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a mapping of check -> entry, got {type(data).__name__}")
    return data


def unit_test_exists(node: str, root: Path = ROOT) -> str | None:
    """Why ``node`` (tests/unit/FILE.py::FUNCTION or ::CLASS::FUNCTION) names no test; None when it does."""
    file, _, rest = node.partition("::")
    parts = rest.split("::") if rest else []
    if not file.startswith("tests/unit/") or not file.endswith(".py") or not 1 <= len(parts) <= 2:
        return "not a node id tests/unit/FILE.py::TEST (or ::CLASS::TEST)"
    if "[" in rest:
        return "name the test function, without a parametrization"
    if not (root / file).is_file():
        return f"{file}: no such file"
    scope = ast.parse((root / file).read_text()).body
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        found = next((n for n in scope if isinstance(n, kinds) and n.name == part), None)
        if found is None:
            return f"{file} defines no {'test' if last else 'class'} {part}"
        scope = getattr(found, "body", [])
    return None


def hollow_checks(record: Path = MUTATION_RECORD) -> set[str]:
    """The checks whose unit evidence passed with the check made a no-op, in the last recorded
    mutation run (tests/conformance/mutation.py)."""
    if not record.exists():
        return set()
    outcomes = json.loads(record.read_text()).get("outcomes", {})
    return {mid.split("#", 1)[0] for mid, o in outcomes.items() if mid.endswith("#noop") and not o.get("killed")}


def yaml_ways(
    entries: dict[str, dict],
    checks: dict[str, Check],
    derived: list[Way],
    root: Path = ROOT,
    hollow: set[str] = frozenset(),
) -> tuple[list[Way], dict[str, str], list[str]]:
    """failures.yaml read: the unit ways, the ``none`` entries (check -> why), and the problems."""
    ways, nones, problems = [], {}, []
    has = {w.check: w for w in sorted(derived, key=lambda w: bool(not w.uncounted))}
    for cid, entry in entries.items():
        if cid not in checks:
            problems.append(
                f"failures.yaml: {cid} is no check (not a test_* function of "
                f"trainbase_conformance/checks/{cid.split('::')[0]})"
            )
            continue
        if not isinstance(entry, dict):
            problems.append(f"failures.yaml: {cid}: an entry is a mapping with shown_by")
            continue
        kind = entry.get("shown_by")
        if kind in ("variant", "foreign"):
            where = "its broken variant's expect.json" if kind == "variant" else "tests/foreign/*/outcomes.json"
            claimed = [w.source for w in derived if w.check == cid and w.kind == kind]
            named = entry.get(kind) or entry.get("variant") or "?"
            said = (
                f"{named} claims it: drop this duplicate"
                if named in claimed
                else f"{named} does not claim it (claimed by: {', '.join(claimed) or 'none'})"
            )
            problems.append(f"failures.yaml: {cid}: {kind} entries are read from {where}, not written here; {said}")
            continue
        if kind not in ENTRY_KEYS:
            problems.append(
                f"failures.yaml: {cid}: shown_by {kind!r}, want unit or none "
                "(variant and foreign entries come from expect.json and outcomes.json)"
            )
            continue
        if extra := set(entry) - ENTRY_KEYS[kind]:
            problems.append(f"failures.yaml: {cid}: unknown keys {sorted(extra)} for shown_by {kind}")
        if kind == "none":
            why = entry.get("why")
            if not isinstance(why, str) or len(why.strip()) < 20:
                problems.append(
                    f"failures.yaml: {cid}: shown_by none needs a why (why no failure can be "
                    "built here, or 'not yet built: ...')"
                )
            elif cid in has and not has[cid].uncounted:
                problems.append(
                    f"failures.yaml: {cid}: says none, but {has[cid].kind} {has[cid].source} shows "
                    "it failing: drop the none entry"
                )
            else:
                nones[cid] = why.strip()
            continue
        node, message = entry.get("unit"), entry.get("message")
        if not isinstance(message, str) or not message.strip():
            problems.append(f"failures.yaml: {cid}: a unit entry needs the message the check gives")
        if not isinstance(node, str) or (why := unit_test_exists(node, root)):
            problems.append(f"failures.yaml: {cid}: unit {node!r}: {why if isinstance(node, str) else 'missing'}")
            continue
        also = entry.get("also") or []
        if not isinstance(also, list):
            problems.append(f"failures.yaml: {cid}: also is a list of unit tests")
            also = []
        for more in also:
            if not isinstance(more, str) or (why := unit_test_exists(more, root)):
                problems.append(
                    f"failures.yaml: {cid}: also {more!r}: {why if isinstance(more, str) else 'not a node id'}"
                )
        ways.append(
            Way(
                cid,
                "unit",
                node,
                (message or "").strip(),
                (entry.get("via") or "").strip(),
                "hollow: its evidence still passes with the check made a no-op (the mutation run)"
                if cid in hollow
                else "",
            )
        )
    return ways, nones, problems


def without_entry(
    checks: dict[str, Check], ways: list[Way], nones: dict[str, str], refused: set[str] = frozenset()
) -> list[str]:
    """The checks with neither a way nor a ``none`` entry, named (but those in ``refused``, whose
    entry's own problem is reported)."""
    missing = sorted(set(checks) - {w.check for w in ways} - set(nones) - set(refused))
    if not missing:
        return []
    return [
        f"{len(missing)} check(s) with no entry: show each failing (a broken variant, a unit test) or add "
        f"`shown_by: none` with a why to tests/conformance/failures.yaml: {', '.join(missing)}"
    ]


@dataclass
class Table:
    checks: dict[str, Check]
    ways: list[Way]
    nones: dict[str, str]
    problems: list[str]

    def ways_of(self, cid: str) -> list[Way]:
        return sorted(
            (w for w in self.ways if w.check == cid), key=lambda w: (bool(w.uncounted), KINDS.index(w.kind), w.source)
        )

    def primary(self) -> dict[str, str]:
        """check -> the strongest way that counts it as shown failing."""
        return {cid: ways[0].kind for cid in self.checks if (ways := [w for w in self.ways_of(cid) if not w.uncounted])}


def build(
    checks: dict[str, Check] | None = None,
    entries: dict[str, dict] | None = None,
    broken: Path = BROKEN,
    foreign: Path = FOREIGN,
    root: Path = ROOT,
    hollow: set[str] | None = None,
) -> Table:
    problems = []
    if checks is None:
        checks, problems = collect_checks()
    entries = load_entries() if entries is None else entries
    variants, p1 = variant_ways(checks, broken)
    foreigns, p2 = foreign_ways(checks, foreign)
    units, nones, p3 = yaml_ways(
        entries, checks, variants + foreigns, root, hollow_checks() if hollow is None else hollow
    )
    ways = variants + foreigns + units
    return Table(checks, ways, nones, problems + p1 + p2 + p3 + without_entry(checks, ways, nones, set(entries)))


# --------------------------------------------------------------------------- the Markdown


def code(text: str) -> str:
    """``text`` as an inline code span inside a table cell: pipes escaped, newlines folded,
    a fence longer than any backtick run in it."""
    text = " ".join(text.split()).replace("|", "\\|")
    run = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def how(w: Way) -> str:
    if w.kind == "variant":
        text = f"variant [`{w.source}`](../tests/conformance/broken/{w.source}/expect.json)"
    elif w.kind == "foreign":
        text = f"foreign image [`{w.source}`](../tests/foreign/{w.source}/outcomes.json)"
    else:
        text = f"unit test {code(w.source)}" + (f" ({cell(w.note)})" if w.note else "")
    return text + (f" — **not counted**, {cell(w.uncounted)}" if w.uncounted else "")


def said(w: Way) -> str:
    return code(w.message)


def render(t: Table) -> str:
    """The block between the markers: the table, the counts, and the checks without a failure."""
    order = sorted(t.checks.values(), key=lambda c: (c.file, c.line))
    rows = ["| check | tier | how it is shown failing | the message it gives |", "|---|---|---|---|"]
    for c in order:
        for w in t.ways_of(c.id) or [None]:
            rows.append(
                f"| `{c.id}` | {c.tier} | " + (f"{how(w)} | {said(w)} |" if w else "no failure yet (below) | — |")
            )
    primary = t.primary()
    by = {k: sum(1 for v in primary.values() if v == k) for k in KINDS}
    also = sum(1 for cid in primary if len({w.kind for w in t.ways_of(cid) if not w.uncounted}) > 1)
    uncounted = [w for w in t.ways if w.uncounted]
    nones = [c for c in order if c.id not in primary]
    lines = [
        START,
        f"<!-- written by `{GENERATOR}` from tests/conformance/failures.yaml, the broken "
        "variants' expect.json and tests/foreign/*/outcomes.json: edit those, not this -->",
        "",
        *rows,
        "",
        f"Each check counted once, by the strongest way it has: {by['variant']} by a broken variant, "
        f"{by['unit']} by a unit test (and no variant), {by['foreign']} by the foreign image only; {also} of "
        f"the {len(primary)} are shown in more than one way. {len(uncounted)} listed way(s) do not count: "
        f"{sum(1 for w in uncounted if w.kind == 'variant')} variant claim(s) CI never builds, "
        f"{sum(1 for w in uncounted if w.kind == 'unit')} hollow unit test(s), "
        f"{sum(1 for w in uncounted if w.kind == 'foreign')} foreign failure(s) of a shared precondition.",
        "",
        f"{len(primary)} of {len(t.checks)} checks are shown failing; {len(nones)} have no failure yet"
        + (":" if nones else "."),
        "",
    ]
    for tier in TIERS:
        mine = sorted((c for c in nones if c.tier == tier), key=lambda c: (c.file, c.line))
        if not mine:
            continue
        lines.append(f"- `{tier}` ({len(mine)}):")
        lines += [f"  - `{c.id}`: {' '.join(t.nones.get(c.id, _uncounted_only(t, c.id)).split())}" for c in mine]
    lines.append(END)
    return "\n".join(lines)


def _uncounted_only(t: Table, cid: str) -> str:
    ways = t.ways_of(cid)
    if not ways:
        return "NO ENTRY in tests/conformance/failures.yaml"
    return "only ways that do not count: " + "; ".join(f"{w.kind} {w.source} ({w.uncounted})" for w in ways)


def current_block(doc_text: str) -> str:
    """The docs' block between the markers, markers included."""
    if doc_text.count(START) != 1 or doc_text.count(END) != 1 or doc_text.index(START) > doc_text.index(END):
        raise ValueError(f"docs/conformance.md must hold one {START} ... {END} block")
    return doc_text[doc_text.index(START) : doc_text.index(END) + len(END)]


def splice(doc_text: str, block: str) -> str:
    return doc_text.replace(current_block(doc_text), block, 1)


def drift_problem(doc_text: str, block: str) -> str | None:
    """Why the docs' table is not ``block``; None when it is."""
    try:
        now = current_block(doc_text)
    except ValueError as e:
        return str(e)
    if now == block:
        return None
    old, new = now.splitlines(), block.splitlines()
    first = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    return (
        f"the failures table in docs/conformance.md is not what the generator writes now (first difference "
        f"at its line {first + 1}: {old[first] if first < len(old) else '<end>'!r} -> "
        f"{new[first] if first < len(new) else '<end>'!r}): run `{GENERATOR}`"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.failures", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the docs' table is out of date")
    a = ap.parse_args(argv)
    t = build()
    if t.problems:
        print("failures table: " + "\n- ".join(["cannot be written:", *t.problems]), file=sys.stderr)
        return 1
    text, block = DOC.read_text(), render(t)
    primary = t.primary()
    print(
        f"{len(primary)} of {len(t.checks)} checks shown failing "
        f"({', '.join(f'{k} {list(primary.values()).count(k)}' for k in KINDS)}); {len(t.checks) - len(primary)} "
        "with none yet"
    )
    if a.check:
        problem = drift_problem(text, block)
        if problem:
            print(problem, file=sys.stderr)
        return 1 if problem else 0
    new = splice(text, block)
    if new != text:
        DOC.write_text(new)
        print(f"wrote {DOC.relative_to(ROOT)}")
    else:
        print(f"{DOC.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
