"""build.py's parser of record: one subcommand per action, each with only the options it reads.

argparse's subparsers rather than a CLI library (click, typer): the command line is small (17
actions, ~40 options), argparse already parsed it, and subparsers give what was missing -- a
``--help`` per action listing only that action's options -- with no new dependency in the tool's
venv. The docs tests build this same parser to check every command line the docs show
(tests/unit/test_docs.py), so there is one description of the CLI, here.

The options come in groups (selection, building, supply chain, delivery); a subcommand adds the
groups, or the single options of a group, that its action reads. The old ``--render``-style
spellings are not options here: legacy.py rewrites them to a subcommand before this parser runs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

PROG = "build.py"
EXIT_CODES = (
    "Exit codes: 0 ok, 1 a check or build failed, 2 bad input (matrix, selection, template, command line), "
    "3 incomplete (every cell this host can build is usable; those of a platform it cannot run were "
    "skipped), 130 interrupted."
)

# what a subcommand reads: a function adding those options to its parser (or to one of its groups)
Adder = Callable[[argparse.ArgumentParser], object]
Options = argparse._ActionsContainer  # a parser or an argument group: both take add_argument


# --------------------------------------------------------------------------- option groups


def matrix_file(p: Options) -> None:
    p.add_argument("--file", default="matrix.yaml", help="the matrix file (default: matrix.yaml)")


def selection(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("selection (default: every included cell)")
    g.add_argument(
        "--select",
        action="append",
        metavar="KEY=VALUE",
        help="filter cells by axis (platform, os, cuda, mpi, ib, framework) or name, e.g. "
        "platform=linux/amd64; repeatable (all must match); VALUE may be a,b (either)",
    )
    g.add_argument("--profile", help="only cells of this profile (e.g. local, production, ci)")


def json_output(what: str) -> Callable[[Options], None]:
    def add(p: Options) -> None:
        p.add_argument("--json", action="store_true", help=what)

    return add


def registry(what: str) -> Callable[[Options], None]:
    def add(p: Options) -> None:
        p.add_argument("--registry", metavar="HOST[:PORT]/NAMESPACE", help=what)

    return add


def zstd_twin(p: Options) -> None:
    p.add_argument(
        "--zstd-twin",
        action="store_true",
        help="also publish TAG-zstd, the same image (or index) with zstd layers (faster pulls for "
        "engines that read zstd; promotion moves latest-zstd with latest)",
    )


def public_key(what: str) -> Callable[[Options], None]:
    def add(p: Options) -> None:
        p.add_argument("--public-key", metavar="PEM", help=what)

    return add


def building(p: argparse.ArgumentParser) -> None:
    b = p.add_argument_group("building")
    b.add_argument("-j", "--jobs", type=int, default=2, help="parallel builds (default 2)")
    b.add_argument("--dry-run", action="store_true", help="print the plan (order, shared parents, cached) and stop")
    b.add_argument(
        "--ca-bundle",
        default="auto",
        metavar="PATH|auto|none",
        help="extra CA bundle for TLS inside builds, passed as a BuildKit secret (never in a layer); "
        "auto = the host's bundle if present",
    )
    b.add_argument(
        "--network",
        default=os.environ.get("TRAINBASE_BUILD_NETWORK") or None,
        help="docker build --network (e.g. host, for an engine without a NAT bridge); "
        "default: $TRAINBASE_BUILD_NETWORK",
    )
    b.add_argument("--log-dir", default="logs", help="one log file per cell under LOG_DIR/<run-id>/")
    b.add_argument("--report", metavar="PATH", help="write the JSON build report here")
    b.add_argument("--no-cache", action="store_true", help="rebuild even when the immutable tag exists")
    b.add_argument("--min-free-gb", type=float, default=10.0, help="refuse to start below this much free disk")
    b.add_argument(
        "--test",
        action="store_true",
        help="after building, run the conformance suite (trainbase_conformance/checks) on the built images",
    )
    b.add_argument(
        "--push",
        nargs="?",
        const="index",
        choices=("index", "stage"),
        help="push every completely built cell (needs --registry): the platforms of one repository "
        "as one index; `stage`: multi-platform repositories to <ns>/staging/ for "
        "`build.py merge-platforms` (CI)",
    )
    registry("where --push publishes and parents are pulled from")(b)
    zstd_twin(b)
    b.add_argument(
        "--sign-key",
        type=Path,
        metavar="PEM",
        help="with --push: sign the SBOM + provenance with this key and attach them",
    )


def supply_chain(p: argparse.ArgumentParser) -> None:
    sc = p.add_argument_group("supply chain (after every build: inventory, SBOM, audits, size budget)")
    sc.add_argument(
        "--supply-dir",
        default="reports/supply",
        metavar="DIR",
        help="per cell and tag: inputs.lock.json, inventory.json, sbom.cdx.json, audit.json, "
        "budget.json, release-notes.md (default reports/supply)",
    )
    sc.add_argument(
        "--locked",
        action="store_true",
        help="rebuild the selected cells without cache from their tag's inputs.lock.json and fail "
        "when any input or output differs",
    )
    sc.add_argument(
        "--allowlist",
        default="audit-allowlist.yaml",
        metavar="PATH",
        help="audit findings accepted, each with a reason and an expiry date",
    )
    sc.add_argument(
        "--python-audit",
        choices=("auto", "require", "warn", "off"),
        default="auto",
        help="Python packages against known vulnerabilities (pip-audit): require = no data fails; "
        "auto = require where the vulnerability service answers (default)",
    )
    sc.add_argument("--no-supply", action="store_true", help="skip the supply-chain step (quick local iterations)")


def ci_plan(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("narrowing the plan")
    d.add_argument("--since", metavar="REV", help="only the cells the changes since REV affect (rebuild or re-test)")
    d.add_argument(
        "--cover",
        action="store_true",
        help="only a small subset that exercises every axis value of the selection (pull requests)",
    )
    d.add_argument(
        "--max-levels",
        type=int,
        metavar="N",
        help="the workflow's number of level jobs: exit 1 when the matrix needs more",
    )
    d.add_argument(
        "--only",
        choices=("published", "unpublished", "unpromoted"),
        help="with --registry: only cells whose immutable tag is (published: with its digest) or is "
        "not in the registry, or is published but not yet what `latest` points at (unpromoted)",
    )
    registry("the registry --only asks")(p)


def promotion(p: argparse.ArgumentParser) -> None:
    registry("the registry whose `latest` tags move (required)")(p)
    d = p.add_argument_group("what may be promoted")
    d.add_argument("--gate", metavar="DIR", type=Path, help="only digests DIR's gate records (*.json) passed")
    d.add_argument(
        "--head-sha",
        default="",
        metavar="SHA",
        help="main's head commit; a run whose recipe commit is another one promotes nothing",
    )
    d.add_argument(
        "--recipe-sha",
        default="",
        metavar="SHA",
        help="with --head-sha: the commit whose recipes this run tested (default: the checkout's HEAD)",
    )
    d.add_argument(
        "--attested-by",
        default="",
        metavar="OWNER/REPO",
        help="the keyless attestations must verify as signed by OWNER/REPO's build-cells.yml (gh attestation verify)",
    )
    public_key("the key the signed attestations must verify with")(p)


def catalogue_record(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("recording a run first")
    g.add_argument(
        "--report",
        metavar="PATH",
        help="a build report (build.py build --report) whose sizes to record in docs/catalogue-record.json",
    )
    g.add_argument("--junitxml", metavar="PATH", help="with --report: the conformance JUnit of that run (its tiers)")
    g.add_argument("--where", metavar="TEXT", help="with --report: where that run was (machine, profile)")


# --------------------------------------------------------------------------- the subcommands

# name -> (one-line help, what it reads). The order is the order `build.py --help` lists them in:
# the matrix and its files first, then building, then delivery.
SUBCOMMANDS: dict[str, tuple[str, list[Adder]]] = {
    "list": (
        "list the selected cells (name, tag, profiles)",
        [
            selection,
            json_output('{"cells": [...], "count": N} instead of the table'),
            lambda p: p.add_argument(
                "--all", action="store_true", help="include the excluded combinations, each with its reason"
            ),
        ],
    ),
    "explain": (
        "say whether a cell exists, and which rule excludes it if not",
        [
            lambda p: p.add_argument(
                "name", metavar="NAME", help="a cell name, or one an excluded combination would have"
            )
        ],
    ),
    "render": ("render images/<cell>/ for every cell", []),
    "check": ("fail (exit 1) when images/ or locks/ drift from a fresh render", []),
    "lock": (
        "resolve stale pip lock sets (needs PyPI), then render",
        [lambda p: p.add_argument("--all", action="store_true", help="re-resolve every lock set, stale or not")],
    ),
    "lock-bases": (
        "lock the selected rows' base images that locks/bases.json lacks, then render",
        [
            selection,
            lambda p: p.add_argument(
                "--all", action="store_true", help="re-resolve every selected base (changes every tag of a moved row)"
            ),
        ],
    ),
    "lint": ("hadolint and the pipefail rule on the rendered Dockerfiles", [selection]),
    "outdated": (
        "report the PyPI pins of matrix.yaml that upstream has newer releases of (changes nothing)",
        [json_output("one JSON object per pin")],
    ),
    "bump": (
        "write the newest release in its series of each pin into matrix.yaml, re-lock, render",
        [
            lambda p: p.add_argument("packages", nargs="*", metavar="PACKAGE", help="only these packages' pins"),
            lambda p: p.add_argument("--dry-run", action="store_true", help="only say what would move; write nothing"),
        ],
    ),
    "catalogue": (
        "write docs/images.md and docs/images.json (every cell's components, sizes, tiers)",
        [catalogue_record],
    ),
    "build": (
        "build the selected cells and the parents they need through the Docker engine (alias: --matrix)",
        [selection, building, supply_chain],
    ),
    "prune": ("remove this namespace's local images whose recipe tag no cell renders any more", []),
    "affected": (
        "the cells the working tree's changes since REV (its merge base) must rebuild or re-test",
        [
            lambda p: p.add_argument("rev", metavar="REV", help="a git revision, e.g. origin/main"),
            json_output("the cells and reasons as JSON"),
        ],
    ),
    "ci-matrix": (
        "the CI job matrix of the selected cells, by FROM level, as KEY=JSON lines ($GITHUB_OUTPUT)",
        [selection, ci_plan],
    ),
    "merge-platforms": (
        "publish each selected repository's multi-arch index from staged images",
        [selection, registry("the registry the staged images are in (required)"), zstd_twin],
    ),
    "promote": (
        "point each selected cell's `latest` at its current recipe tag's digest, registry side",
        [selection, promotion],
    ),
    "verify-attestations": (
        "check the signed SBOM + provenance of REF, or of each selected cell in a registry",
        [
            lambda p: p.add_argument(
                "ref",
                nargs="?",
                default="",
                metavar="REF",
                help="HOST/REPO:TAG or HOST/REPO@DIGEST (default: each selected cell)",
            ),
            selection,
            registry("where the selected cells' images are (without REF)"),
            public_key("the key the attestations must be signed with"),
        ],
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="trainbase: declared matrix -> Dockerfiles -> images -> conformance.",
        epilog="`build.py COMMAND --help` lists the options COMMAND reads. `build.py --matrix ...` is "
        "`build.py build ...`; the other old spellings (--render, --list, ...) still work and print "
        "the new form. " + EXIT_CODES,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands", required=True)
    for name, (summary, adders) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=summary, description=summary[:1].upper() + summary[1:] + ".", epilog=EXIT_CODES)
        for add in [*adders, matrix_file]:
            add(sp)
    return p


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's own parser, by name (for legacy.py, the help tests and the docs tests)."""
    action = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)
