"""`trainbase-conformance`: the suite as one command on any machine with a Docker engine (a GPU
runner, a laptop), no checkout needed. It runs the packaged checks through pytest with this
package's plugin; anything it does not know is handed to pytest unchanged.

    trainbase-conformance IMAGE... [--tier static,cpu,...] [--expect FILE] [--require-hardware]
                          [--junitxml OUT.xml] [--markdown OUT.md] [PYTEST ARGS...]

Exit status is pytest's: 0 all selected checks passed (or skipped with a reason) and each image's
verdict passed (some check ran against it: checks/test_verdict.py), 1 a check or a verdict
failed, 2 bad usage (an unknown tier, an invalid expectations file, no image)."""

from __future__ import annotations

import argparse
import sys

from . import TIERS, expectations
from .resources import CHECKS

DEFAULT_TIERS = ("static", "cpu")


def parse_tiers(text: str) -> list[str]:
    """Split a --tier value: "static,cpu" -> [static, cpu]; "all" -> every tier; unknown -> error."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(TIERS)
    unknown = [t for t in names if t not in TIERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown tier {', '.join(unknown) or '(none)'}: choose from {', '.join(TIERS)} or 'all'"
        )
    return list(dict.fromkeys(names))


def pytest_args(ns: argparse.Namespace, passthrough: list[str]) -> list[str]:
    """The pytest command line for the parsed options (the plugin's own options by name)."""
    # rootdir: the checks' own folder, so test ids read test_mpi.py::... wherever it runs
    # The command itself imported the package before pytest started, so pytest cannot rewrite
    # the plugin's asserts and says so once per package: they carry their own messages.
    args = [
        str(CHECKS),
        f"--rootdir={CHECKS}",
        "-p",
        "trainbase_conformance.plugin",
        "-p",
        "no:cacheprovider",
        "-ra",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "-m",
        " or ".join(ns.tier),
    ]
    for ref in ns.images:
        args += ["--image", ref]
    if ns.expect:
        args += ["--expect", ns.expect]
    if ns.junitxml:
        args += ["--junitxml", ns.junitxml]
    if ns.report:
        args += ["--report", ns.report]
    if ns.require_hardware:
        args.append("--require-hardware")
    args += ["--conformance-report", ns.markdown]
    return args + passthrough


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="trainbase-conformance",
        description="Prove that distributed-training images work: MPI ranks, NCCL, InfiniBand userspace, "
        "frameworks, launcher environment, runtimes. Checks each image against its own "
        "/etc/trainbase/manifest.json or, for an image trainbase did not build, --expect FILE.",
        epilog="Other options go to pytest (e.g. -k EXPR, -x, --collect-only).",
    )
    ap.add_argument("images", nargs="*", metavar="IMAGE", help="image references (local, or pulled first)")
    ap.add_argument(
        "--tier",
        type=parse_tiers,
        default=list(DEFAULT_TIERS),
        help=f"comma-separated tiers from {', '.join(TIERS)}, or 'all' (default: static,cpu); "
        "gpu and fabric skip with the reason on a host without a GPU / RDMA device",
    )
    ap.add_argument(
        "--expect",
        metavar="FILE",
        help="expectations (YAML/JSON) for images without a trainbase manifest; beside an image's own "
        "manifest, each claim of FILE the manifest does not make fails that image's verdict",
    )
    ap.add_argument(
        "--require-hardware",
        action="store_true",
        help="gpu/fabric tiers fail instead of skipping where the host lacks a GPU / RDMA "
        "device (for GPU runners: a lost GPU must not pass)",
    )
    ap.add_argument("--junitxml", metavar="OUT.xml", help="JUnit report (each case names its image and tier)")
    # declared here, not left to pytest: an undeclared `--report FILE` had FILE taken for an IMAGE
    ap.add_argument(
        "--report",
        metavar="BUILD.json",
        help="check the images a `build.py build --report` run built (instead of, or beside, IMAGE)",
    )
    ap.add_argument(
        "--markdown",
        metavar="OUT.md",
        default="conformance.md",
        help="image x check summary (default: ./conformance.md)",
    )
    return ap


# pytest's options that take a value, as users pass them on: argparse knows only this command's
# options, so in "-k EXPR" it would take EXPR for an IMAGE. These are set aside with their values
# before parsing and handed to pytest as given.
PYTEST_VALUE_OPTIONS = frozenset(
    (
        "-k",
        "-m",
        "-p",
        "-o",
        "-W",
        "-c",
        "-n",
        "--tb",
        "--maxfail",
        "--deselect",
        "--ignore",
        "--durations",
        "--basetemp",
        "--rootdir",
        "--log-level",
        "--timeout",
    )
)


def split_pytest_values(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without pytest's valued options, those options with their values, in order)."""
    rest: list[str] = []
    pytest_opts: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in PYTEST_VALUE_OPTIONS and i + 1 < len(argv):
            pytest_opts += argv[i : i + 2]
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    return rest, pytest_opts


def main(argv: list[str] | None = None) -> int:
    import pytest

    ap = parser()
    own, pytest_opts = split_pytest_values(list(sys.argv[1:] if argv is None else argv))
    ns, passthrough = ap.parse_known_args(own)
    passthrough += pytest_opts
    if not ns.images and not ns.report:
        ap.error("name at least one IMAGE (or pass --report BUILD.json)")
    if ns.expect:
        try:
            expectations.load(ns.expect)  # refuse a bad file before any container starts
        except expectations.ExpectationsError as e:
            print(f"trainbase-conformance: {e}", file=sys.stderr)
            return 2
    return int(pytest.main(pytest_args(ns, passthrough)))


if __name__ == "__main__":
    sys.exit(main())
