"""The image x check matrix of a conformance run, as Markdown a person reads at a glance (with
the evidence each check gives). The machine-readable report is pytest's own --junitxml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import EVIDENCE

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

    def seconds(self, image: str) -> float:
        return sum(o.seconds for o in self.rows.values() if o.image == image)

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
        lines += ["| image | passed | failed | error | skipped | time (s) | facts |", "|---|---|---|---|---|---|---|"]
        for im in images:
            c = self.counts(im)
            facts = ", ".join(f"{k} {v}" for k, v in self.images.get(im, {}).items())
            lines.append(
                f"| {im} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | "
                f"{self.seconds(im):.1f} | {facts} |"
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
