"""The plugin's command-line options, and the images they name."""

from __future__ import annotations

import pytest

from trainbase_common.safe_io import InputError
from trainbase_common.states import build_report, usable_images


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("trainbase conformance")
    g.addoption(
        "--image",
        action="append",
        default=[],
        metavar="REF",
        help="image to test (repeatable), e.g. trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:latest",
    )
    g.addoption(
        "--report",
        action="append",
        default=[],
        metavar="BUILD.json",
        help="test every image with status built/cached in this build report (repeatable)",
    )
    g.addoption(
        "--expect",
        default=None,
        metavar="FILE",
        help="for an image without /etc/trainbase/manifest.json (not built by trainbase): what it "
        "claims to hold, YAML/JSON following expectations.schema.json; beside an image's own manifest, "
        "each claim of FILE the manifest does not make fails that image's verdict",
    )
    g.addoption(
        "--conformance-report",
        default="reports/conformance.md",
        metavar="PATH",
        help="Markdown summary (image x check); for JUnit use pytest's --junitxml",
    )
    g.addoption("--shm-size", default="1g", help="--shm-size for every container (default 1g)")
    g.addoption(
        "--require-hardware",
        action="store_true",
        help="the gpu and fabric tiers FAIL instead of skipping on a host without a GPU / RDMA "
        "device: a GPU runner that lost its GPU must not pass",
    )
    g.addoption(
        "--derived-tiers",
        default=None,
        metavar="TIER,...",
        help="an image built FROM another one of this run (a framework on its base): only these "
        "tiers; the others are deselected, as the summary says (default: all tiers)",
    )
    g.addoption(
        "--broken-variants",
        action="store_true",
        help="also collect test_broken_variants.py (the suite's self-test) in a directory run",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Every --report is read before anything is collected: one cut short, not JSON or of another
    shape (what a killed build or a wrong path gives) stops the run with one line and exit 2."""
    for path in config.getoption("--report", None) or []:
        try:
            build_report(path)
        except (InputError, OSError) as e:
            pytest.exit(f"--report {e}", returncode=2)


def image_refs(config: pytest.Config) -> list[str]:
    """The images under test: every --image, then every usable image of each --report, once each."""
    refs: list[str] = list(config.getoption("--image") or [])
    for path in config.getoption("--report") or []:
        refs += usable_images(path)
    return list(dict.fromkeys(refs))
