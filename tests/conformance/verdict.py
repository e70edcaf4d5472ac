"""The self-test's verdict on one broken variant, kept free of Docker so that it is unit-tested
(tests/unit/test_broken_variant_verdict.py): what a conformance run's JUnit says about each
check, and whether that proves what the variant's expect.json claims -- each named check
FAILED (an error is a crash of the check's own setup, not a rejected image) and with a message
that matches the pattern written for the assertion the variant's defect trips. A check that
fails for another reason proves nothing about the check its name promises.

expect.json's ``must_fail`` maps each check to that pattern (a Python regex, searched with
re.DOTALL in the failure's message, i.e. the first line(s) of pytest's report):

    "must_fail": {"test_x": {"message": "REGEX", "why": "the assertion it targets"}}
    "must_fail": {"test_x": "REGEX"}                       (the same, without a why)

For a JUnit file of a real run (the self-test keeps it under pytest's tmp directory and names
it when it fails), this prints each test case's state and message, and with --variant the
verdict against that variant's expect.json:

    .venv/bin/python -m tests.conformance.verdict JUNIT.xml [--variant NAME [--gpu]]
    .venv/bin/python -m tests.conformance.verdict JUNIT.xml --foreign tests/foreign/IMAGE/outcomes.json

--foreign judges a run on an image trainbase did not build against its recorded verdict: each
check's state, and a pattern for each failure's message (judge_recorded).

``gpu_must_fail`` (same format) holds claims on checks of the gpu tier: a GPU runner builds the
variant FROM the digest it tests and judges them (scripts/gpu-variants.sh, in gpu.yml's gpu job).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

BROKEN = Path(__file__).resolve().parent / "broken"

# worst first: the state a check has over all its parametrizations (the control needs every
# one of them to pass)
RANK = {"error": 0, "failed": 1, "passed": 2, "skipped": 3}


@dataclass(frozen=True)
class Case:
    """One JUnit test case: its full name (with parameters), the check it runs, its state and
    the message pytest wrote for it (empty for a pass)."""

    name: str
    check: str
    state: str  # passed | failed | error | skipped
    message: str
    module: str = ""  # the check's module (test_mpi), from the case's classname

    @property
    def key(self) -> str:
        """``module::check``, as the foreign images' outcomes.json names checks."""
        return f"{self.module}::{self.check}"


@dataclass(frozen=True)
class Expected:
    """One check a variant must fail, and the pattern its failure message must match."""

    check: str
    pattern: str
    why: str = ""

    def matches(self, message: str) -> bool:
        return re.search(self.pattern, message, re.S) is not None


def cases_from_junit(xml: str | bytes) -> list[Case]:
    """Every test case of a pytest JUnit document. An <error> anywhere in a case (setup or
    teardown crashed, even after the call failed) makes it an error: the run did not judge the
    image there."""
    out = []
    for case in ET.fromstring(xml).iter("testcase"):  # noqa: S314 -- the JUnit file pytest wrote in this run
        name = case.get("name", "")
        found = {c.tag: c for c in case if c.tag in ("failure", "error", "skipped")}
        state = next(
            (s for tag, s in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")) if tag in found),
            "passed",
        )
        el = found.get({"error": "error", "failed": "failure", "skipped": "skipped"}.get(state, ""))
        out.append(
            Case(
                name,
                name.split("[", 1)[0],
                state,
                el.get("message", "") if el is not None else "",
                case.get("classname", "").rsplit(".", 1)[-1],
            )
        )
    return out


def worst_states(cases: list[Case]) -> dict[str, str]:
    """check -> the worst state over its parametrizations."""
    out: dict[str, str] = {}
    for c in cases:
        if c.check not in out or RANK[c.state] < RANK[out[c.check]]:
            out[c.check] = c.state
    return out


GPU_CLAIMS = "gpu_must_fail"  # the claims a GPU runner judges (gpu.yml, scripts/gpu-variants.sh)


def expectations(expect: dict, key: str = "must_fail") -> dict[str, Expected]:
    """expect.json's ``must_fail`` (or ``gpu_must_fail``: checks of the gpu tier, which only a
    GPU runner can run against the variant), read; a list of names (the format before
    patterns) or a pattern that does not compile is refused, naming the check."""
    must = expect.get(key)
    if not isinstance(must, dict) or not must:
        raise ValueError(f"{key} must map each check to the pattern its failure message must match, got {must!r}")
    out = {}
    for check, spec in must.items():
        pattern, why = (spec, "") if isinstance(spec, str) else (spec.get("message"), spec.get("why", ""))
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"{key}.{check}: no message pattern")
        try:
            re.compile(pattern, re.S)
        except re.error as e:
            raise ValueError(f"{key}.{check}: the pattern does not compile: {e}") from None
        out[check] = Expected(check, pattern, why)
    return out


def one_line(text: str, limit: int = 600) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def judge(expected: dict[str, Expected], cases: list[Case]) -> list[str]:
    """Why this run does not prove what expect.json claims; empty when it does. Accepted: every
    named check failed in at least one parametrization, every failure of it matches its
    pattern, and no case of the run errored. Other parametrizations may pass or skip (a variant
    can break one mode of a check and leave the others working)."""
    problems = [
        f"{c.name} ERRORED instead of failing: its fixture or setup crashed, so the check is broken, "
        f"the image was not judged: {one_line(c.message)}"
        for c in cases
        if c.state == "error"
    ]
    for check, want in expected.items():
        mine = [c for c in cases if c.check == check]
        if not mine:
            problems.append(f"{check} did not run (check its file in `paths` and the `k` expression)")
            continue
        failed = [c for c in mine if c.state == "failed"]
        for c in failed:
            if not want.matches(c.message):
                problems.append(
                    f"{c.name} failed for another reason than the variant's defect"
                    f"{f' ({want.why})' if want.why else ''}:\n    message: {one_line(c.message, 1500)}\n"
                    f"    pattern: {want.pattern}"
                )
        if not failed and not any(c.state == "error" for c in mine):
            states = [f"{c.name} {c.state}" + (f" ({one_line(c.message, 200)})" if c.message else "") for c in mine]
            problems.append(f"{check} did not fail: " + ", ".join(states))
    return problems


def judge_recorded(outcomes: dict, cases: list[Case]) -> list[str]:
    """Why this run of an image trainbase did not build is not the verdict its outcomes.json
    records; empty when it is. Every check the run holds has a recorded state: the ones in
    ``must_fail`` fail, each with a message matching its pattern (as a variant's, ``judge``), and
    every other check has exactly its state in ``states`` (passed or skipped) -- so a check that
    drifts from passed to skipped, or one that is new or gone, is named, not only a change in the
    set of failures."""
    keyed = [Case(c.name, c.key, c.state, c.message, c.module) for c in cases]
    must = expectations(outcomes)
    problems = judge(must, keyed)
    recorded = outcomes.get("states") or {}
    both = sorted(set(must) & set(recorded))
    if both:
        problems.append(f"recorded as failing and in states too: {', '.join(both)}")
    for key, state in sorted(worst_states(keyed).items()):
        if key in must or state == "error":  # judged above (an error is named there)
            continue
        want = recorded.get(key)
        failure = next((c.message for c in keyed if c.check == key and c.state == state and c.message), "")
        why = f": {one_line(failure, 300)}" if failure else ""
        if want is None:
            problems.append(f"{key} {state}, and outcomes.json records no state for it (a new check: record it){why}")
        elif state != want:
            problems.append(f"{key} {state}, recorded {want}{why}")
    ran = {c.check for c in keyed}
    problems += [
        f"{key} is recorded {want} but did not run (renamed or removed?)"
        for key, want in sorted(recorded.items())
        if key not in ran
    ]
    return problems


def recorded_states(outcomes: dict, cases: list[Case]) -> dict[str, str]:
    """``states`` for outcomes.json from a run whose failures are the recorded ones: every
    check's worst state, but the must_fail ones."""
    keyed = [Case(c.name, c.key, c.state, c.message, c.module) for c in cases]
    return {k: v for k, v in sorted(worst_states(keyed).items()) if k not in (outcomes.get("must_fail") or {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.verdict", description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", help="a pytest --junitxml file of a conformance run")
    ap.add_argument("--variant", help="judge it against tests/conformance/broken/VARIANT/expect.json")
    ap.add_argument(
        "--gpu", action="store_true", help=f"judge the variant's {GPU_CLAIMS} (a run of the gpu tier on a GPU runner)"
    )
    ap.add_argument(
        "--width",
        type=int,
        default=600,
        help="characters of each message shown on one line (0: all of it, its lines as they are)",
    )
    ap.add_argument(
        "--foreign",
        metavar="OUTCOMES",
        help="judge it against an image's recorded verdict (tests/foreign/*/outcomes.json)",
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="with --foreign: write this run's states into OUTCOMES (after a reviewed change)",
    )
    ap.add_argument("--verdict-only", action="store_true", help="print the verdict, not every case")
    a = ap.parse_args(argv)
    cases = cases_from_junit(Path(a.junit).read_bytes())
    for c in [] if a.verdict_only else cases:
        msg = c.message if a.width == 0 else one_line(c.message, a.width)
        print(f"{c.state:8} {c.name}" + (f"\n         {msg}" if msg else ""))
    if a.foreign:
        return foreign_main(Path(a.foreign), cases, a.record)
    if not a.variant:
        return 0
    expected = expectations(
        json.loads((BROKEN / a.variant / "expect.json").read_text()), GPU_CLAIMS if a.gpu else "must_fail"
    )
    problems = judge(expected, cases)
    print(f"\n{a.variant}: " + ("fails as its expect.json says" if not problems else "does NOT prove its checks:"))
    for p in problems:
        print(f"  - {p}")
    for e in expected.values():
        print(f"  {e.check}: /{e.pattern}/" + (f"  ({e.why})" if e.why else ""))
    return 1 if problems else 0


def foreign_main(path: Path, cases: list[Case], record: bool) -> int:
    outcomes = json.loads(path.read_text())
    if record:
        outcomes["states"] = recorded_states(outcomes, cases)
        path.write_text(json.dumps(outcomes, indent=2) + "\n")
        print(f"\nrecorded {len(outcomes['states'])} states in {path}")
    problems = judge_recorded(outcomes, cases)
    name = path.parent.name
    print(
        f"\n{name}: "
        + (
            f"the recorded verdict: {len(outcomes['must_fail'])} checks fail, each for its reason, "
            f"{len(outcomes.get('states') or {})} pass or skip as recorded"
            if not problems
            else "NOT the recorded verdict:"
        )
    )
    for p in problems:
        print(f"  - {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
