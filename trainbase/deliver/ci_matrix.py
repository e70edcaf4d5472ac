"""The CI job matrix, generated from matrix.yaml: `build.py --ci-matrix`.

No workflow names a cell or a version: they fan out over what this prints, so a CUDA version
added to matrix.yaml reaches CI with no workflow edit.

Levels: a framework cell is built FROM its parent's immutable tag, which a runner pulls from
the registry, so every parent must be published before its children start. The build
workflow runs one fan-out job per FROM level (base cells, then PyTorch/TensorFlow, then
Horovod/DeepSpeed). GitHub Actions cannot create jobs at run time, so the workflow declares
a fixed number of level jobs; `--max-levels N` makes this command fail, naming the fix, when
the matrix ever needs more, and a unit test checks the workflow declares as many level jobs
as the whole matrix needs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..build.plan import Plan
from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..render import recipes as rendermod
from ..render.recipes import Rendered
from . import disk_plan, platforms, runners
from .registry import split_registry


class TooDeep(Exception):
    """The matrix needs more FROM levels than the workflow has jobs for."""


def entries(m: Matrix, rendered: dict[str, Rendered], cells: list[Cell]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One matrix entry per buildable cell (plan order, parents first): name, level, the
    immutable tag and the local image reference. Cells that cannot be built (an artifact
    without a verified checksum, in themselves or under them) are left out, with the reason --
    decided by platforms.publishable, which promotion, the merge and the mirrors ask too, so the
    ``release_tag`` each entry carries is the tag they look for."""
    plan = Plan(m, rendered, cells)
    level = plan.levels()
    releases = platforms.publishable(m, rendered, cells)
    release_of = {c.name: r for r in releases.values() for c in r.cells}
    refused = {name: why for r in releases.values() for name, why in r.left_out.items()}
    out = []
    for name, job in plan.jobs.items():
        if name not in release_of:
            continue
        plat = m.spec.platforms[job.cell.platform]
        out.append(
            {
                "name": name,
                "level": level[name],
                "tag": job.tag,
                "image": job.image,
                # where it builds natively (command() applies the repository's runner
                # variables: runners.route), and which self-hosted GPU runners test it
                "platform": job.cell.platform,
                "arch": plat.arch,
                "runs_on": plat.runner,
                "gpu_label": plat.gpu_runner_label,
                "repository": job.repository,
                # what the job holds on disk at once; the build refuses a runner with less
                "disk": disk_plan.plan(m, rendered, job.cell),
                # the tag the repository is published under: one index for its built platforms
                "release_tag": release_of[name].tag,
            }
        )
    return out, refused


def by_level(items: list[dict[str, Any]], max_levels: int | None) -> list[list[dict[str, Any]]]:
    """Entries grouped by FROM level (index = level). Raises TooDeep past ``max_levels``."""
    depth = 1 + max((e["level"] for e in items), default=-1)
    if max_levels is not None and depth > max_levels:
        raise TooDeep(
            f"the matrix has {depth} FROM levels but the workflow declares {max_levels} level jobs: "
            f"add a build-level{max_levels} job to .github/workflows/build.yml and raise BUILD_LEVELS"
        )
    levels: list[list[dict[str, Any]]] = [[] for _ in range(max(depth, max_levels or 0))]
    for e in items:
        levels[e["level"]].append(e)
    return levels


def chain_values(m: Matrix, c: Cell) -> set[tuple[str, str]]:
    """The (axis, value) pairs a cell's build exercises: its own axes, and the framework of
    every cell under it (a DeepSpeed image is built on a PyTorch one). A framework image does
    not exercise framework=none: only testing a base image does."""
    values = {(axis, value) for axis, value in c.axes.items() if axis != "framework"}
    x: Cell | None = c
    while x is not None:
        if x is c or x.framework != "none":
            values.add(("framework", x.framework))
        x = m.cell(x.parent) if x.parent else None
    return values


def cover(m: Matrix, cells: list[Cell]) -> list[Cell]:
    """A small subset of ``cells`` that, built and tested, exercises every axis value the whole
    set has (greedy set cover; ties keep matrix order). What pull-request CI runs: a change that
    adds a CUDA version, or touches every cell, is tested on each OS, CUDA, MPI, IB row and
    framework it reaches, without building the whole matrix on every push to a branch."""
    todo = set().union(*(chain_values(m, c) for c in cells)) if cells else set()
    chosen: list[Cell] = []
    while todo:
        best = max(cells, key=lambda c: len(chain_values(m, c) & todo))
        chosen.append(best)
        todo -= chain_values(m, best)
    keep = {c.name for c in chosen}
    return [c for c in cells if c.name in keep]


def with_registry_state(
    items: list[dict[str, Any]],
    registry_arg: str,
    only: str,
    digest: Callable[[str, str, str], str | None],
    unattested: Callable[[str, str, str], list[str]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Keep the entries whose immutable tag is (``only="published"``) or is not
    (``"unpublished"``) in the registry, or is published while the alias points elsewhere
    (``"unpromoted"``: what the GPU tier must pass before promote.py moves the alias).
    Published entries get ``ref``: the pushed image by digest, which is what the GPU tier pulls
    and tests, and ``twin_ref``: its zstd twin by digest ('' when none), which the scan job
    scans too. ``digest(host, repo, tag)`` asks the registry (registry.digest: an error, never a
    guess, when it cannot say).

    ``"unpublished"`` also keeps a published entry whose digest lacks its SBOM or provenance
    (``unattested(host, repo, digest)``: what is missing, attest.unattested) with ``attest``
    naming it: an attestation step that failed after the push left that digest unattested,
    promotion refuses it, and only a build that finds it so attests it (build-cells' attest
    steps take a digest found published without them: attest.github_subject)."""
    from .publish import ALIAS, ZSTD

    host, ns = split_registry(registry_arg)
    kept, left_out = [], {}
    for item in items:
        e = item
        repo = f"{ns}/{e.get('repository', e['name'])}"
        d = digest(host, repo, e.get("release_tag", e["tag"]))
        lacking: list[str] = []
        if only == "unpromoted":
            promoted = d is not None and digest(host, repo, ALIAS) == d
            wanted, why = d is not None and not promoted, "promoted" if promoted else "not published"
        elif only == "unpublished" and d is not None and unattested is not None:
            # the zstd twin is another digest with its own attestations (latest-zstd needs them)
            twin = digest(host, repo, f"{e.get('release_tag', e['tag'])}{ZSTD}")
            lacking = unattested(host, repo, d) + (unattested(host, repo, twin) if twin else [])
            wanted, why = bool(lacking), "published and attested"
        else:
            wanted, why = (d is not None) == (only == "published"), "published" if d else "not published"
        if wanted:
            e = dict(e, ref=f"{host}/{repo}@{d}") if d else e
            if d and only != "unpublished":
                # the zstd twin is another digest: gpu.yml's scan job scans it too, so that
                # promote can move latest-zstd on records for its own digest
                twin = digest(host, repo, f"{e.get('release_tag', e['tag'])}{ZSTD}")
                e = dict(e, twin_ref=f"{host}/{repo}@{twin}" if twin else "")
            kept.append(dict(e, attest=lacking) if lacking else e)
        else:
            left_out[e["name"]] = why
    return kept, left_out


def _unattested() -> Callable[[str, str, str], list[str]]:
    """attest.unattested through one referrers client per registry host."""
    from . import attest, referrers

    clients: dict[str, referrers.Client] = {}
    return lambda host, repo, d: attest.unattested(clients.setdefault(host, referrers.Client(host)), repo, d)


def github_outputs(
    items: list[dict[str, Any]], levels: list[list[dict[str, Any]]], left_out: dict[str, str]
) -> list[str]:
    """`KEY=JSON` lines for $GITHUB_OUTPUT (and for a person): every entry, each level, and
    what was left out with why."""
    lines = [
        f"cells={json.dumps(items, separators=(',', ':'))}",
        f"count={len(items)}",
        f"depth={1 + max((e['level'] for e in items), default=-1)}",
    ]
    lines += [f"level{i}={json.dumps(lv, separators=(',', ':'))}" for i, lv in enumerate(levels)]
    lines.append(f"left_out={json.dumps(left_out, separators=(',', ':'))}")
    return lines


def command(m: Matrix, root: Path, selected: list[Cell], args: argparse.Namespace) -> int:
    """`build.py --ci-matrix`: the selection (narrowed by --since, --cover, --only) as
    $GITHUB_OUTPUT lines."""
    from . import affected as affectedmod

    if args.only and not args.registry:
        raise TrainbaseError("--only needs --registry HOST[:PORT]/NAMESPACE (the registry to ask)")
    if args.since:
        touched = affectedmod.since(m, root, args.since).test  # rebuilt cells are re-tested too
        selected = [c for c in selected if c.name in touched]
    rendered = rendermod.render_all(m, selected, root=root)
    items, left_out = entries(m, rendered, selected)
    if args.cover:  # among the cells that can be built, so every value stays covered
        chosen = {c.name for c in cover(m, [m.cell(e["name"]) for e in items])}
        items = [e for e in items if e["name"] in chosen]
    if args.only:
        from . import registry  # the engine adapter, only when a registry is asked

        items, unwanted = with_registry_state(
            items, args.registry, args.only, registry.digest, _unattested() if args.only == "unpublished" else None
        )
        left_out.update(unwanted)
    try:
        # the build runners; for a pull request (GITHUB_EVENT_NAME, which GitHub sets in every
        # step and no workflow can override) GitHub-hosted ones only
        for note in runners.route(items, os.environ):
            print(f"::warning::{note}", file=sys.stderr)
        levels = by_level(items, args.max_levels)
    except (TooDeep, runners.UntrustedRunner) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(github_outputs(items, levels, left_out)))
    return 0
