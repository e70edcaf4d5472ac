"""Command line of build.py. Exit codes: 0 ok, 1 a check/build failed, 2 bad input."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .define import base_lock
from .define import pip_locks as lockmod
from .define.matrix import Cell, Matrix, load, parse_selects
from .errors import TrainbaseError
from .render import hadolint
from .render import recipes as rendermod
from .render.pipefail_lint import command as pipefail_command

if TYPE_CHECKING:
    from .run.executor import Executor


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build.py",
        description="trainbase: declared matrix -> Dockerfiles -> images -> conformance.",
        epilog="Exit codes: 0 ok, 1 a check or build failed, 2 bad input (matrix, selection, template), 3 incomplete (every "
               "cell this host can build is usable; those of a platform it cannot run were skipped), 130 interrupted.",
    )
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--render", action="store_true", help="render images/<cell>/ for every cell")
    act.add_argument("--check", action="store_true", help="fail (exit 1) when images/ or locks/ drift from a fresh render")
    act.add_argument("--list", action="store_true", help="list the selected cells")
    act.add_argument("--explain", metavar="NAME", help="say whether a cell exists, and which rule excludes it if not")
    act.add_argument("--lock", action="store_true", help="resolve stale pip lock sets (needs PyPI), then render")
    act.add_argument("--lock-bases", action="store_true",
                     help="lock the selected rows' base images that locks/bases.json lacks (bootstrap: a fresh "
                          "debootstrap; registry: the manifest digest, nothing pulled), then render; with --all "
                          "re-resolve every selected one (changes every tag of a moved row); a base no registry "
                          "answers for fails it")
    act.add_argument("--lint", action="store_true", help="hadolint and the pipefail rule on the rendered Dockerfiles")
    act.add_argument("--matrix", action="store_true", help="build the selected cells through the Docker engine")
    act.add_argument("--prune", action="store_true",
                     help="remove this namespace's local images whose recipe tag no cell renders any more")
    act.add_argument("--affected", metavar="REV",
                     help="the cells the working tree's changes since REV (its merge base) must rebuild or re-test")
    act.add_argument("--outdated", action="store_true",
                     help="report the PyPI pins of matrix.yaml that upstream has newer releases of (changes nothing)")
    act.add_argument("--bump", nargs="*", metavar="PACKAGE",
                     help="write the newest release in its series of each pin (or of these packages) that no "
                          "hold keeps back into matrix.yaml, re-resolve the locks, render, and print the cells "
                          "whose tags move; refuses a bump that makes a cell impossible (with --dry-run: only say)")
    act.add_argument("--promote", action="store_true",
                     help="point each selected cell's `latest` at its current recipe tag's digest, registry side "
                          "(needs --registry; with --gate DIR only where the gate passed that digest)")
    act.add_argument("--merge-platforms", action="store_true", help="publish each selected repository's multi-arch index from staged images")
    act.add_argument("--verify-attestations", nargs="?", const="", metavar="REF",
                     help="check the signed SBOM + provenance attached to REF (HOST/REPO:TAG|@DIGEST) or to each selected cell in --registry")
    act.add_argument("--catalogue", action="store_true",
                     help="write docs/images.md and docs/images.json (every cell: its components, GPU architectures, "
                          "driver, and the size and tiers a recorded run measured); with --report BUILD.json "
                          "[--junitxml JUNIT.xml] --where TEXT first record that run in docs/catalogue-record.json")
    act.add_argument("--ci-matrix", action="store_true",
                     help="the CI job matrix of the selected cells, by FROM level, as KEY=JSON lines ($GITHUB_OUTPUT)")
    p.add_argument("--file", default="matrix.yaml", help="the matrix file (default: matrix.yaml)")
    p.add_argument("--select", action="append", metavar="KEY=VALUE",
                   help="filter cells by axis (platform, os, cuda, mpi, ib, framework) or name, e.g. platform=linux/amd64; "
                        "repeatable; VALUE may be a,b")
    p.add_argument("--profile", help="only cells of this profile (e.g. local, production, ci)")
    p.add_argument("--json", action="store_true", help='with --list: {"cells": [...], "count": N}; --outdated: one per pin')
    b = p.add_argument_group("building (--matrix)")
    b.add_argument("-j", "--jobs", type=int, default=2, help="parallel builds (default 2)")
    b.add_argument("--dry-run", action="store_true", help="print the plan (order, shared parents, cached) and stop")
    b.add_argument("--ca-bundle", default="auto", metavar="PATH|auto|none",
                   help="extra CA bundle for TLS inside builds, passed as a BuildKit secret (never in a layer); "
                        "auto = the host's bundle if present")
    b.add_argument("--network", default=os.environ.get("TRAINBASE_BUILD_NETWORK") or None,
                   help="docker build --network (e.g. host, for an engine without a NAT bridge); "
                        "default: $TRAINBASE_BUILD_NETWORK")
    b.add_argument("--log-dir", default="logs", help="one log file per cell under LOG_DIR/<run-id>/")
    b.add_argument("--report", metavar="PATH", help="write the JSON build report here (--catalogue: read it)")
    b.add_argument("--junitxml", metavar="PATH", help="with --catalogue --report: the conformance JUnit of that run")
    b.add_argument("--where", metavar="TEXT", help="with --catalogue --report: where that run was (machine, profile)")
    b.add_argument("--no-cache", action="store_true", help="rebuild even when the immutable tag exists")
    sc = p.add_argument_group("supply chain (after every build: inventory, SBOM, audits, size budget)")
    sc.add_argument("--supply-dir", default="reports/supply", metavar="DIR",
                    help="per cell and tag: inputs.lock.json, inventory.json, sbom.cdx.json, audit.json, "
                         "budget.json, release-notes.md (default reports/supply)")
    sc.add_argument("--locked", action="store_true",
                    help="rebuild the selected cells without cache from their tag's inputs.lock.json and fail "
                         "when any input or output differs")
    sc.add_argument("--allowlist", default="audit-allowlist.yaml", metavar="PATH",
                    help="audit findings accepted, each with a reason and an expiry date")
    sc.add_argument("--python-audit", choices=("auto", "require", "warn", "off"), default="auto",
                    help="Python packages against known vulnerabilities (pip-audit): require = no data fails; "
                         "auto = require where the vulnerability service answers (default)")
    sc.add_argument("--no-supply", action="store_true", help="skip the supply-chain step (quick local iterations)")
    b.add_argument("--min-free-gb", type=float, default=10.0, help="refuse to start below this much free disk")
    b.add_argument("--test", action="store_true",
                   help="after building, run the conformance suite (trainbase_conformance/checks) on the built images")
    b.add_argument("--push", nargs="?", const="index", choices=("index", "stage"),
                   help="push every completely built cell (needs --registry): the platforms of one repository as one "
                        "index; `stage`: multi-platform repositories to <ns>/staging/ for --merge-platforms (CI)")
    b.add_argument("--zstd-twin", action="store_true",
                   help="with --push or --merge-platforms: also publish TAG-zstd, the same image (or index) with zstd layers (faster pulls for "
                        "engines that read zstd; promotion moves latest-zstd with latest)")
    b.add_argument("--registry", metavar="HOST[:PORT]/NAMESPACE",
                   help="where --push publishes and parents are pulled from; what --ci-matrix --only asks")
    b.add_argument("--sign-key", type=Path, metavar="PEM", help="with --push: sign the SBOM + provenance with this key and attach them")
    b.add_argument("--public-key", metavar="PEM", help="with --verify-attestations: the key the attestations must be signed with")
    d = p.add_argument_group("delivery (--ci-matrix)")
    d.add_argument("--since", metavar="REV", help="only the cells the changes since REV affect (rebuild or re-test)")
    d.add_argument("--cover", action="store_true",
                   help="only a small subset that exercises every axis value of the selection (pull requests)")
    d.add_argument("--max-levels", type=int, metavar="N", help="the workflow's number of level jobs: exit 1 when the matrix needs more")
    d.add_argument("--only", choices=("published", "unpublished", "unpromoted"),
                   help="with --registry: only cells whose immutable tag is (published: with its digest) or is "
                        "not in the registry, or is published but not yet what `latest` points at (unpromoted)")
    d.add_argument("--gate", metavar="DIR", type=Path, help="with --promote: only digests DIR's gate records (*.json) passed")
    d.add_argument("--head-sha", default="", metavar="SHA",
                   help="with --promote: main's head commit; a run whose recipe commit is another one promotes nothing")
    d.add_argument("--recipe-sha", default="", metavar="SHA",
                   help="with --promote --head-sha: the commit whose recipes this run tested (default: the checkout's HEAD)")
    d.add_argument("--attested-by", default="", metavar="OWNER/REPO",
                   help="with --promote: the keyless attestations must verify as signed by OWNER/REPO's build-cells.yml "
                        "(gh attestation verify)")
    p.add_argument("--all", action="store_true", help="with --list: include excluded cells and their reasons; "
                   "with --lock: re-resolve every set; with --lock-bases: every selected base")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except TrainbaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `build.py --list | head`: the reader left; no traceback (Python's docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def run(args: argparse.Namespace) -> int:
    m = load(args.file)
    root = m.path.resolve().parent
    filters = parse_selects(args.select)
    if args.explain:
        return explain(m, args.explain)
    if args.list:
        return list_cells(m, filters, args.profile, as_json=args.json, include_excluded=args.all)
    selected = m.select(filters, args.profile) if (filters or args.profile) else m.included
    if args.render:
        return render(m, root)
    if args.check:
        return check(m, root)
    if args.catalogue:
        from .render import catalogue
        return catalogue.command(m, root, args.report, args.junitxml, args.where)
    if args.lock:
        sets = rendermod.lock_sets(rendermod.render_all(m, root=root))
        written = lockmod.write(root, sets, only_stale=not args.all, log=lambda s: print(s, file=sys.stderr))
        gone = lockmod.remove_orphans(root, sets)
        print(f"{len(written)} lock file(s) written, {len(sets) - len(written)} current, {len(gone)} no cell uses removed")
        return render(m, root)
    if args.lock_bases:
        from .build import bases

        failed = None
        try:
            entries = bases.relock(m, root, selected, log=lambda s: print(f"base: {s}", file=sys.stderr),
                                   refresh=args.all)
        except TrainbaseError as e:   # what did resolve is written: render it, then fail the job
            failed, entries = e, base_lock.load(root)
        locked = sum(1 for e in entries.values() if e.identity)
        print(f"{base_lock.LOCK_FILE}: {locked} base(s) locked, {len(entries) - locked} unlocked")
        code = render(m, root)
        if failed:
            print(f"error: {failed}", file=sys.stderr)
            return 1
        return code
    if args.lint:
        rendered = rendermod.render_all(m, selected, root=root)
        code = hadolint.run([r.dockerfile for r in rendered.values() if r.cell in selected], root)
        return max(code, pipefail_command(rendered, root))
    if args.matrix:
        return build_matrix(m, root, selected, args)
    if args.prune:
        from .run.prune import prune
        return prune(m, root)
    if args.affected:
        return affected(m, root, args.affected, as_json=args.json)
    if args.ci_matrix:
        from .deliver import ci_matrix as cimod
        return cimod.command(m, root, selected, args)
    if args.bump is not None:
        from .render import bump
        return bump.command(m.path, args.bump, args.dry_run, sys.stdout)
    if args.outdated:
        from .define import outdated
        return outdated.command(m.path, json_output=args.json)
    if args.verify_attestations is not None:
        from .deliver import attest
        return attest.verify_command(m, root, selected, args.verify_attestations, args.registry, args.public_key)
    if args.promote or args.merge_platforms:
        from .deliver import platforms, promote
        if args.merge_platforms:
            return platforms.merge_command(m, root, selected, args.registry, zstd_twin=args.zstd_twin)
        return promote.command(m, root, selected, args.registry, args.gate, head_sha=args.head_sha,
                               recipe_sha=args.recipe_sha, public_key=args.public_key,
                               attested_by=args.attested_by)
    return 0


def render(m: Matrix, root: Path) -> int:
    rendered = rendermod.render_all(m, root=root)
    changed, removed = rendermod.write(rendered, root)
    print(f"rendered {len(rendered)} cells: {len(changed)} changed, {len(removed)} removed")
    for n in changed:
        print(f"  changed  {n}")
    for n in removed:
        print(f"  removed  {n}")
    stale = rendermod.missing_locks(rendered, root)
    if stale:
        for s in stale:
            print(f"  lock     {s}", file=sys.stderr)
        print("error: some pip locks are missing or stale; run `python build.py --lock`", file=sys.stderr)
        return 1
    return 0


def check(m: Matrix, root: Path) -> int:
    rendered = rendermod.render_all(m, root=root)
    problems = rendermod.check(m, rendered, root)
    if problems:
        cells = sorted({p.split(":", 1)[0] for p in problems if not p.startswith("lock:")})
        print(f"drift: {len(problems)} problem(s) in {len(cells)} cell(s); run `python build.py --render`"
              f" (or --lock) and commit:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"ok: images/ matches matrix.yaml + templates/ for {len(rendered)} cells")
    return 0


def cell_record(m: Matrix, c: Cell, rendered: dict[str, rendermod.Rendered] | None = None) -> dict[str, Any]:
    rec = {
        "name": c.name,
        "dockerfile": f"{rendermod.IMAGES_DIR}/{c.name}/Dockerfile" if not c.excluded else None,
        "axes": c.axes,
        "framework_version": c.framework_version,
        "parent": c.parent,
        "profiles": list(c.profiles),
        "level": _level(m, c),
        "excluded": c.excluded,
    }
    if rendered and c.name in rendered:
        r = rendered[c.name]
        rec["tag"] = r.tag
        rec["image"] = f"{m.spec.naming.namespace}/{c.name}:{r.tag}"
        chain: list[str] = []
        x: rendermod.Rendered | None = r
        while x is not None:               # a cell cannot build while anything under it is pending
            chain += [a for a in x.context.artifacts if m.spec.artifacts[a].file_for(x.cell.platform).pending]
            x = rendered.get(x.cell.parent) if x.cell.parent else None
        rec["artifacts_pending"] = sorted(set(chain))
    return rec


def _level(m: Matrix, c: Cell) -> int:
    """Depth in the FROM chain: 0 for base cells. CI fans out level by level."""
    return 0 if not c.parent else 1 + _level(m, m.cell(c.parent))


def list_cells(m: Matrix, filters: dict[str, Any], profile: str | None, *, as_json: bool, include_excluded: bool) -> int:
    if include_excluded:
        cells = [c for c in m.cells if all((c.name if k == "name" else getattr(c, k)) in v for k, v in filters.items())]
        if profile:
            cells = [c for c in cells if profile in c.profiles]
    else:
        cells = m.select(filters, profile)
    rendered = rendermod.render_all(m, [c for c in cells if not c.excluded], root=m.path.resolve().parent)
    records = [cell_record(m, c, rendered) for c in cells]
    if as_json:
        json.dump({"cells": records, "count": len(records)}, sys.stdout, indent=2)
        print()
        return 0
    width = max((len(c.name) for c in cells), default=10)
    for rec in records:
        if rec["excluded"]:
            print(f"{rec['name']:<{width}}  EXCLUDED  {rec['excluded']}")
        else:
            prof = ",".join(rec["profiles"]) or "-"
            print(f"{rec['name']:<{width}}  {rec['tag']}  {prof}")
    n_ex = sum(1 for r in records if r["excluded"])
    print(f"{len(records) - n_ex} cells" + (f", {n_ex} excluded" if n_ex else ""))
    return 0


def explain(m: Matrix, name: str) -> int:
    c = find(m, name)
    if c is None:
        print(f"{name}: no such cell. Names look like {m.included[0].name}; "
              f"`build.py --list --all` lists every combination.", file=sys.stderr)
        return 2
    axes = " ".join(f"{k}={v}" for k, v in c.axes.items())
    if c.excluded:
        print(f"{c.name}: EXCLUDED ({axes})\n  because {c.excluded}")
    else:
        chain = f"\n  built on: {c.parent}" if c.parent else ""
        print(f"{c.name}: INCLUDED ({axes}){chain}\n  profiles: {', '.join(c.profiles) or '-'}")
    return 0


def find(m: Matrix, name: str) -> Cell | None:
    """A cell by exact name, or an excluded combination by any name it could have had (each
    declared release of its frameworks: the 12.8 row's pytorch2.10.0-... named on cuda12.9)."""
    by = m.by_name()
    if name in by:
        return by[name]
    for c in m.cells:
        if c.excluded and c.framework != "none" and name in aliases(m, c):
            return c
    return None


def aliases(m: Matrix, c: Cell) -> list[str]:
    chain, x = [], c
    while x.framework != "none":
        chain.append(x.framework)
        x = m.cell(x.parent) if x.parent else x
        if not x.parent and x.framework != "none":
            break
    fmt = m.spec.naming.framework_prefix.format
    versions = [[r.version for r in m.spec.frameworks[fw].releases] for fw in chain]
    return ["".join(fmt(framework=fw, framework_version=v) for fw, v in zip(chain, combo, strict=True)) + x.name
            for combo in itertools.product(*versions)]


def build_matrix(m: Matrix, root: Path, selected: list[Cell], args: argparse.Namespace) -> int:
    from .deliver import registry
    from .run import executor, report
    from .supply.chain import SupplyOptions

    if args.push:
        registry.split_registry(args.registry or "")
    if args.sign_key:           # a key that cannot sign fails now, not after the builds
        from .supply import attestation
        if not args.push:
            raise TrainbaseError("--sign-key signs what --push publishes: add --push")
        try:
            attestation.load_signer(args.sign_key)
        except attestation.AttestationError as e:
            raise TrainbaseError(str(e)) from None
    rendered = rendermod.render_all(m, selected, root=root)   # the selection and its parents
    stale = rendermod.check(m, rendered, root, orphans=False)
    if stale:
        print("error: images/ or locks/ differ from what matrix.yaml renders; the build uses the committed "
              "files, so fix that first (`python build.py --render`, or --lock):", file=sys.stderr)
        for p in stale[:10]:
            print(f"  {p}", file=sys.stderr)
        return 2
    opts = executor.Options(jobs=args.jobs, ca_bundle=args.ca_bundle, network=args.network,
                           log_dir=(root / args.log_dir) if not Path(args.log_dir).is_absolute() else Path(args.log_dir),
                           dry_run=args.dry_run, push=bool(args.push), stage=args.push == "stage",
                           registry=args.registry, no_cache=args.no_cache, zstd_twin=args.zstd_twin, sign_key=args.sign_key,
                           min_free_gb=args.min_free_gb, supply=None if args.no_supply else SupplyOptions(
                               dir=root / args.supply_dir, allowlist=Path(args.allowlist), locked=args.locked,
                               python_audit=args.python_audit))
    if args.test and args.push:
        # publish only what passed: build, test, then push in a second (all-cached) run
        opts.push = False
    if args.test and not args.report:
        args.report = str(root / "reports" / "build.json")
    b = executor.Executor(m, rendered, selected, opts, root)
    code = b.run()
    if args.dry_run:
        return code
    if args.report:                 # first: a summary that fails to print must not lose the report
        report.write_report(b, args.report)
    _summary(report, b)
    if args.report:
        print(f"report: {args.report}")
    if args.test and code != 130:
        import subprocess

        tested = subprocess.run([sys.executable, "-m", "pytest", str(root / "trainbase_conformance" / "checks"),
                                 "--report", args.report, "--junitxml", str(root / "reports" / "conformance.xml")],
                                cwd=root, check=False)
        if tested.returncode and code in (0, executor.INCOMPLETE):
            code = 1            # a conformance failure outranks "incomplete"
        if args.push and code == 0:
            opts.push, opts.dry_run = True, False
            b2 = executor.Executor(m, rendered, selected, opts, root)
            code = b2.run()
            _summary(report, b2)
        elif args.push:
            print("publish: nothing pushed: the build or the conformance suite failed", file=sys.stderr)
    return code


def _summary(report: ModuleType, b: Executor) -> None:
    """The summary table; if it cannot be printed (a terminal that went away, a rich bug), a
    plain line per cell instead -- never a traceback in place of the result and exit code."""
    try:
        report.summary(b)
    except Exception as e:  # noqa: BLE001 -- the run's result must still reach the person
        print(f"(summary table failed: {type(e).__name__}: {e}; plain summary follows)", file=sys.stderr)
        for j in b.jobs.values():
            print(f"{j.name}\t{j.tag}\t{j.status}\t{j.reason or ''}")


def affected(m: Matrix, root: Path, rev: str, *, as_json: bool) -> int:
    from .deliver import affected as affectedmod

    a = affectedmod.since(m, root, rev)
    print(json.dumps(a.as_json(), indent=2) if as_json else affectedmod.describe(a))
    return 0
