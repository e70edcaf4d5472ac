"""The results of a conformance run: each check's outcome per image (with its tier, for
pytest's --junitxml) into the image x check matrix, and the Markdown summary written and
printed at the end. JUnit is pytest's own --junitxml: each test case carries its image and tier
as properties, the host and image facts are test-suite properties (record_testsuite_property)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from . import TIERS, session
from .collection import DERIVED_NOTE, check_name, image_ref, module_name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    rep = outcome.get_result()
    ref = image_ref(item)
    if ref is None:
        return
    image = ref  # as given: trainbase-bootstrap/debian:12.15-slim, not debian:12.15-slim
    tier = next((t for t in TIERS if item.get_closest_marker(t)), "")
    if rep.when == "setup":
        item.user_properties.append(("image", image))
        item.user_properties.append(("tier", tier))
    message, longrepr = "", ""
    if rep.skipped:
        lr = rep.longrepr
        message = lr[2] if isinstance(lr, tuple) else str(lr)
        message = message.removeprefix("Skipped: ")
    elif rep.failed:
        longrepr = str(rep.longrepr)
        crash = getattr(rep.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else longrepr.strip().splitlines()[-1]
    state = "skipped" if rep.skipped else "failed" if rep.failed else "passed"
    if rep.when == "setup" and rep.failed:
        state = "error"
    module = module_name(item)
    session.results(item.config).add(
        image,
        module,
        check_name(item),
        rep.when,
        state,
        message,
        rep.duration,
        longrepr,
        order=(module, item.location[1] or 0),
    )


def write_report(config: pytest.Config) -> Path | None:
    """The Markdown matrix (image x check, evidence share) at --conformance-report; None when no
    check of any image ran."""
    results = session.results(config)
    if not results.rows:
        return None
    results.host = session.host_caps(config).describe()
    images = list(dict.fromkeys(o.image for o in results.rows.values()))
    facts = session.image_facts(config)
    results.images = {im: facts.get(im, {}) for im in images}
    md = Path(config.getoption("--conformance-report"))
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(results.markdown())
    return md


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    md = write_report(config)
    if md is None:
        return
    results = session.results(config)
    terminalreporter.section("trainbase conformance")
    terminalreporter.write(results.markdown())
    if results.evidence:
        terminalreporter.write_line(results.evidence_summary())
    for image in results.images:
        terminalreporter.write_line(results.ran_line(image))
    if DERIVED_NOTE in config.stash:
        terminalreporter.write_line(config.stash[DERIVED_NOTE])
    terminalreporter.write_line(f"summary: {md}")
