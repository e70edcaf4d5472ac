"""One function per subcommand of build.py: each reads the options its subcommand lists
(parser.py), calls into the stage that does the work, and returns the exit code. ``ACTIONS``
maps a subcommand to its function; a test checks it and the parser name the same commands.

The stages a single action needs are imported inside it, so ``build.py list`` does not load
the registry client or the executor."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..define import base_lock
from ..define import pip_locks as lockmod
from ..define.matrix import Cell, Matrix, parse_selects
from ..errors import TrainbaseError
from ..render import context, hadolint
from ..render import recipes as rendermod
from ..render.pipefail_lint import command as pipefail_command
from . import cells as cellmod
from . import printing

Action = Callable[[Matrix, Path, argparse.Namespace], int]


def selected(m: Matrix, args: argparse.Namespace) -> list[Cell]:
    """The cells ``--select`` / ``--profile`` pick; every included cell without them."""
    filters = parse_selects(args.select)
    # `--profile ''` is a profile no matrix declares, not "no profile" (list says so too)
    return m.select(filters, args.profile) if (filters or args.profile is not None) else m.included


# --------------------------------------------------------------------------- the matrix and its files


def list_cells(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    filters = parse_selects(args.select)
    if args.all:
        cells = [c for c in m.cells if all((c.name if k == "name" else getattr(c, k)) in v for k, v in filters.items())]
        if args.profile:
            cells = [c for c in cells if args.profile in c.profiles]
    else:
        cells = m.select(filters, args.profile)
    rendered = rendermod.render_all(m, [c for c in cells if not c.excluded], root=root)
    printing.cells([cellmod.cell_record(m, c, rendered) for c in cells], as_json=args.json)
    return 0


def explain(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    c = cellmod.find(m, args.name)
    if c is None:
        printing.no_such_cell(m, args.name)
        return 2
    fabric = None
    if not c.excluded:
        # what the cell's manifest claims of matrix.yaml's fabric (its platform, IB row and MPI
        # decide; nccl-tests also needs the row's nvcc), as the image will say it
        claims = context.build(m, c).manifest["components"]
        fabric = [
            f"{name} {claims[name].get('name', name)} {claims[name]['version']}".replace(f"{name} {name} ", f"{name} ")
            for name, _ in m.spec.fabric
            if name in claims
        ]
    printing.explanation(c, args.name, fabric)
    return 0


def render(m: Matrix, root: Path, args: argparse.Namespace | None = None) -> int:
    rendered = rendermod.render_all(m, root=root)
    new = frozenset(r.cell.name for r in rendered.values() if not (root / r.dockerfile).exists())
    changed, removed = rendermod.write(rendered, root)
    stale = rendermod.missing_locks(rendered, root)
    printing.rendered(len(rendered), changed, removed, stale, new)
    printing.leftovers(m.leftovers())
    from ..render import catalogue as cataloguemod  # the catalogue names each cell's recipe tag

    for path in cataloguemod.write(m, root):
        print(f"wrote {path} (the recipe tags changed)")
    from ..render import figures  # counts in the docs' prose follow the matrix (issue 65)

    changed_docs, unknown = figures.write(m, root)
    for path in changed_docs:
        print(f"wrote {path} (its figures follow the matrix)")
    if unknown:
        printing.drift(unknown)
        return 2
    return 1 if stale else 0


def check(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..render import env_contract, figures

    rendered = rendermod.render_all(m, root=root)
    problems = rendermod.check(m, rendered, root) + figures.check(m, root)
    printing.leftovers(m.leftovers())
    _unrecorded_driver_branches(rendered)
    if problems:
        printing.drift(problems)
        return 1
    printing.no_drift(len(rendered))
    # every $VAR the rendered Dockerfiles expand is set where the build expands it (issue 61)
    return env_contract.report(
        env_contract.check(root, {r.cell.name: r.files[r.dockerfile] for r in rendered.values()})
    )


def _unrecorded_driver_branches(rendered: dict[str, rendermod.Rendered]) -> None:
    """A CUDA row just added names an nvidia/cuda tag whose forward-compatibility branches are
    not recorded: said (a warning: the catalogue then promises the native driver only, which is
    never a driver the image refuses), with where to record them."""
    from trainbase_common import driver_promise

    bases = [str(r.context.data["os"]["base"]) for r in rendered.values() if not r.cell.parent]
    for toolkit in driver_promise.unrecorded(bases):
        print(
            f"warning: nvidia/cuda:{toolkit}: the driver branches its NVIDIA_REQUIRE_CUDA admits through forward "
            "compatibility are not recorded (trainbase_common/driver_promise.py NVIDIA_CUDA_BASES, read from the "
            "base's config); the catalogue promises its native driver only",
            file=sys.stderr,
        )


def lock(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    sets = rendermod.lock_sets(rendermod.render_all(m, root=root))
    written = lockmod.write(root, sets, only_stale=not args.all, log=lambda s: print(s, file=sys.stderr))
    gone = lockmod.remove_orphans(root, sets)
    printing.locks_written(len(written), len(sets) - len(written), len(gone))
    if (root / base_lock.LOCK_FILE).exists():  # a dropped version's bases go too (issue 65)
        from ..build import bases

        bases.drop_unused(m, root, log=lambda s: print(f"base: {s}", file=sys.stderr))
    return render(m, root)


def lock_bases(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..build import bases

    failed = None
    try:
        entries = bases.relock(
            m, root, selected(m, args), log=lambda s: print(f"base: {s}", file=sys.stderr), refresh=args.all
        )
    except TrainbaseError as e:  # what did resolve is written: render it, then fail the job
        failed, entries = e, base_lock.load(root)
    locked = sum(1 for e in entries.values() if e.identity)
    printing.bases_locked(base_lock.LOCK_FILE, locked, len(entries) - locked)
    code = render(m, root)
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    return code


def lint(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    cells = selected(m, args)
    rendered = rendermod.render_all(m, cells, root=root)
    code = hadolint.run([r.dockerfile for r in rendered.values() if r.cell in cells], root)
    return max(code, pipefail_command(rendered, root))


def outdated(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..define import outdated as outdatedmod

    return outdatedmod.command(m.path, json_output=args.json)


def bump(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..render import bump as bumpmod

    return bumpmod.command(m.path, args.packages, args.dry_run, sys.stdout)


def catalogue(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..render import catalogue as cataloguemod

    return cataloguemod.command(m, root, args.report, args.junitxml, args.where)


# --------------------------------------------------------------------------- building


def build(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    """Build the selection (and the parents it needs); with --test, then the conformance suite
    on what was built; with --test --push, publish only when both passed."""
    from ..deliver import registry
    from ..run import executor, report
    from ..supply.chain import SupplyOptions

    if args.jobs < 1:  # 0 or fewer builds nothing and would exit 0
        raise TrainbaseError(f"-j/--jobs {args.jobs}: at least 1 parallel build")
    cells = selected(m, args)
    if args.push:
        registry.split_registry(args.registry or "")
    if args.sign_key:  # a key that cannot sign fails now, not after the builds
        from ..supply import attestation

        if not args.push:
            raise TrainbaseError("--sign-key signs what --push publishes: add --push")
        try:
            attestation.load_signer(args.sign_key)
        except attestation.AttestationError as e:
            raise TrainbaseError(str(e)) from None
    rendered = rendermod.render_all(m, cells, root=root)  # the selection and its parents
    stale = rendermod.check(m, rendered, root, orphans=False)
    if stale:
        printing.stale_before_build(stale)
        return 2
    log_dir = Path(args.log_dir) if Path(args.log_dir).is_absolute() else root / args.log_dir
    supply = (
        None
        if args.no_supply
        else SupplyOptions(
            dir=root / args.supply_dir,
            allowlist=Path(args.allowlist),
            locked=args.locked,
            python_audit=args.python_audit,
        )
    )
    opts = executor.Options(
        jobs=args.jobs,
        ca_bundle=args.ca_bundle,
        network=args.network,
        log_dir=log_dir,
        dry_run=args.dry_run,
        push=bool(args.push),
        stage=args.push == "stage",
        registry=args.registry,
        no_cache=args.no_cache,
        zstd_twin=args.zstd_twin,
        sign_key=args.sign_key,
        min_free_gb=args.min_free_gb,
        supply=supply,
    )
    if args.test and args.push:
        # publish only what passed: build, test, then push in a second (all-cached) run
        opts.push = False
    if args.test and not args.report:
        args.report = str(root / "reports" / "build.json")
    b = executor.Executor(m, rendered, cells, opts, root)
    code = b.run()
    if args.dry_run:
        return code
    if args.report:  # first: a summary that fails to print must not lose the report
        report.write_report(b, args.report)
    printing.build_summary(report, b)
    if args.report:
        print(f"report: {args.report}")
    if args.test and not b.stopped:
        import subprocess

        from ..run import signals

        try:
            # a signal here: subprocess.run kills pytest (and pytest's `finally`s have removed its
            # containers on the way), then the record says where the run stopped
            tested = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    str(root / "trainbase_conformance" / "checks"),
                    "--report",
                    args.report,
                    "--junitxml",
                    str(root / "reports" / "conformance.xml"),
                ],
                cwd=root,
                check=False,
            )
        except KeyboardInterrupt as e:
            b.stopped = {"signal": signals.name_of(e), "stage": "conformance tests"}
            report.write_report(b, args.report)
            print(f"interrupted: {signals.name_of(e)} during the conformance tests; nothing pushed", file=sys.stderr)
            return signals.exit_code(e)
        if tested.returncode and code in (0, executor.INCOMPLETE):
            code = 1  # a conformance failure outranks "incomplete"
        if args.push and code == 0:
            opts.push, opts.dry_run = True, False
            b2 = executor.Executor(m, rendered, cells, opts, root)
            code = b2.run()
            printing.build_summary(report, b2)
        elif args.push:
            print("publish: nothing pushed: the build or the conformance suite failed", file=sys.stderr)
    if args.report and not b.stopped:
        from ..render import catalogue as cataloguemod

        junit = str(root / "reports" / "conformance.xml") if args.test else None
        print(
            "record this run in the catalogue (docs/images.md): "
            + cataloguemod.record_command(args.report, junit, args.profile)
        )
    return code


def prune(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..run.prune import prune as prunemod

    return prunemod(m, root)


# --------------------------------------------------------------------------- delivery


def affected(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..deliver import affected as affectedmod

    a = affectedmod.since(m, root, args.rev)
    print(json.dumps(a.as_json(), indent=2) if args.json else affectedmod.describe(a))
    return 0


def ci_matrix(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..deliver import ci_matrix as cimod

    return cimod.command(m, root, selected(m, args), args)


def merge_platforms(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..deliver import platforms

    return platforms.merge_command(m, root, selected(m, args), args.registry, zstd_twin=args.zstd_twin)


def promote(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..deliver import promote as promotemod

    return promotemod.command(
        m,
        root,
        selected(m, args),
        args.registry,
        args.gate,
        head_sha=args.head_sha,
        recipe_sha=args.recipe_sha,
        public_key=args.public_key,
        attested_by=args.attested_by,
    )


def verify_attestations(m: Matrix, root: Path, args: argparse.Namespace) -> int:
    from ..deliver import attest

    return attest.verify_command(m, root, selected(m, args), args.ref, args.registry, args.public_key)


ACTIONS: dict[str, Action] = {
    "list": list_cells,
    "explain": explain,
    "render": render,
    "check": check,
    "lock": lock,
    "lock-bases": lock_bases,
    "lint": lint,
    "outdated": outdated,
    "bump": bump,
    "catalogue": catalogue,
    "build": build,
    "prune": prune,
    "affected": affected,
    "ci-matrix": ci_matrix,
    "merge-platforms": merge_platforms,
    "promote": promote,
    "verify-attestations": verify_attestations,
}
