"""The image x check matrix of a conformance run, as Markdown a person reads at a glance (with
the evidence each check gives). The machine-readable report is pytest's own --junitxml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import EVIDENCE
from .expectations import undeclared_component

# The module of the per-image verdict (checks/test_verdict.py): it judges the others, so the
# counts below leave it out and the summary shows it in a column of its own.
VERDICT_MODULE = "test_verdict"
OUTCOME_ORDER = {"failed": 0, "error": 1, "passed": 2, "skipped": 3}


@dataclass
class Outcome:
    image: str
    module: str
    check: str  # test name without the image parameter
    outcome: str = "passed"  # passed | failed | skipped | error
    message: str = ""
    seconds: float = 0.0
    longrepr: str = ""
    order: tuple[Any, ...] = ()  # (module, line): rows follow the test files


@dataclass
class Tally:
    """What the run did with one image's checks: how many ran (passed or failed), how many could
    not start (error: their setup failed) and, of those skipped, which for want of a declaration
    (component -> checks) and which for another reason (their messages)."""

    ran: int = 0
    passed: int = 0
    failed: int = 0
    error: int = 0
    undeclared: dict[str, int] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def not_declared(self) -> int:
        """Checks skipped because what they check is neither declared nor in the image."""
        return sum(self.undeclared.values())

    @property
    def skipped(self) -> int:
        return self.not_declared + len(self.other)


@dataclass
class Results:
    """Collected by the conftest from pytest's reports; rendered at the end of the session."""

    host: dict[str, str] = field(default_factory=dict)
    images: dict[str, dict[str, str]] = field(default_factory=dict)  # image -> facts (id, size, ...)
    rows: dict[tuple[str, str, str], Outcome] = field(default_factory=dict)
    evidence: dict[tuple[str, str], str] = field(default_factory=dict)  # (module, check) -> EVIDENCE kind

    def evidence_summary(self) -> str:
        """One line: how many distinct checks prove what, and the presence-only share."""
        if not self.evidence:
            return ""
        n = len(self.evidence)
        kinds = {k: sum(1 for v in self.evidence.values() if v == k) for k in EVIDENCE}
        share = 100.0 * kinds["presence"] / n
        parts = ", ".join(f"{k} {kinds[k]}" for k in EVIDENCE)
        return f"Evidence: {n} checks: {parts}; presence-only share {share:.1f} %"

    def add(
        self,
        image: str,
        module: str,
        check: str,
        when: str,
        outcome: str,
        message: str,
        seconds: float,
        longrepr: str = "",
        order: tuple[Any, ...] = (),
    ) -> None:
        key = (image, module, check)
        o = self.rows.setdefault(key, Outcome(image, module, check, order=order or (module, 0)))
        o.seconds += seconds
        if when == "call" or (when == "setup" and outcome != "passed"):
            o.outcome, o.message, o.longrepr = outcome, message, longrepr
        elif when == "teardown" and outcome == "failed" and o.outcome == "passed":
            o.outcome, o.message, o.longrepr = "error", "teardown: " + message, longrepr

    def counts(self, image: str) -> dict[str, int]:
        c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for o in self.rows.values():
            if o.image == image:
                c[o.outcome] = c.get(o.outcome, 0) + 1
        return c

    def tally(self, image: str) -> Tally:
        """The checks of ``image`` by what the run did with them (the verdict's own not counted)."""
        t = Tally()
        for o in self.rows.values():
            if o.image != image or o.module == VERDICT_MODULE:
                continue
            if o.outcome == "skipped":
                component = undeclared_component(o.message)
                if component:
                    t.undeclared[component] = t.undeclared.get(component, 0) + 1
                else:
                    t.other.append(o.message)
                continue
            if o.outcome == "error":
                t.error += 1
                t.errors.append(o.message)
                continue
            t.ran += 1
            setattr(t, o.outcome, getattr(t, o.outcome) + 1)
        return t

    def seconds(self, image: str) -> float:
        return sum(o.seconds for o in self.rows.values() if o.image == image)

    def ran_line(self, image: str) -> str:
        """One line per image for the end of the run: how many checks ran against how many were
        skipped for want of a declaration, and which declarations those were."""
        t = self.tally(image)
        why = f" ({', '.join(f'{k}: {n}' for k, n in sorted(t.undeclared.items()))})" if t.undeclared else ""
        verdict = next((o for o in self.rows.values() if o.image == image and o.module == VERDICT_MODULE), None)
        said = "" if verdict is None or verdict.outcome == "passed" else f": {_first_line(verdict.message)}"
        return (
            f"{image}: {t.ran} check(s) ran ({t.passed} passed, {t.failed} failed), {t.error} could not start, "
            f"{t.not_declared} skipped for want of a declaration{why}, {len(t.other)} skipped as not applicable; "
            f"verdict: {verdict.outcome if verdict else 'not run'}{said}"
        )

    def markdown(self) -> str:
        images = list(self.images) or sorted({o.image for o in self.rows.values()})
        firsts: dict[tuple[str, str], tuple[tuple[Any, ...], str]] = {}
        for o in self.rows.values():
            firsts.setdefault((o.module, o.check), (o.order, o.check))
        checks = sorted(firsts, key=firsts.__getitem__)
        lines = ["# Conformance summary", ""]
        lines += ["Host: " + "; ".join(f"{k}: {v}" for k, v in self.host.items()), ""]
        if self.evidence:
            lines += [self.evidence_summary(), ""]
            presence = sorted(f"{m}::{c}" for (m, c), k in self.evidence.items() if k == "presence")
            if presence:
                lines += ["Presence-only checks: " + ", ".join(presence), ""]
        lines += [
            "| image | verdict | ran | passed | failed | error | skipped: not declared | skipped: n/a | time (s) "
            "| facts |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for im in images:
            t = self.tally(im)
            facts = ", ".join(f"{k} {v}" for k, v in self.images.get(im, {}).items())
            verdicts = [o for o in self.rows.values() if o.image == im and o.module == VERDICT_MODULE]
            verdict = _cell(verdicts[0]).split(":", 1)[0] if verdicts else "-"
            lines.append(
                f"| {im} | {verdict} | {t.ran} | {t.passed} | {t.failed} | {t.error} | {t.not_declared} | "
                f"{len(t.other)} | {self.seconds(im):.1f} | {facts} |"
            )
        lines += ["", "| check | " + " | ".join(images) + " |", "|---|" + "---|" * len(images)]
        for module, check in checks:
            cells = []
            for im in images:
                cells.append(_cell(self.rows.get((im, module, check))))
            lines.append(f"| {module}::{check} | " + " | ".join(cells) + " |")
        failed = [o for o in self.rows.values() if o.outcome in ("failed", "error")]
        if failed:
            lines += ["", "## Failures", ""]
            for o in failed:
                lines.append(f"- **{o.image}** `{o.module}::{o.check}`: {_one_line(o.message, 400)}")
        return "\n".join(lines) + "\n"


def _first_line(message: str) -> str:
    """A check's failure message without its exception name and pytest's assertion detail."""
    return (message.strip().splitlines() or [""])[0].removeprefix("AssertionError: ").removeprefix("Failed: ")


def _one_line(s: str, n: int) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _cell(o: Outcome | None) -> str:
    if o is None:
        return "-"
    if o.outcome == "passed":
        return "pass"
    word = {"failed": "**FAIL**", "error": "**ERROR**", "skipped": "skip"}[o.outcome]
    return f"{word}: {_one_line(o.message, 90)}".replace("|", "\\|")
