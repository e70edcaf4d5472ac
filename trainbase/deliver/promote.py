"""Promotion: `build.py --promote --registry HOST[:PORT]/NAMESPACE [--gate DIR]`.

Publishing (publish.py) pushes immutable tags only: they are the staging area, nothing a user
pulls by name moves. Promotion then points each cell's moving alias (`latest`) at the digest of
the cell's CURRENT recipe tag, registry side, by digest (`skopeo copy` of the manifest: no
layer moves, no local image is involved, so no job can race another's push):

- a repository whose release tag is not in the registry keeps its alias where it is, and so
  does one none of whose selected cells can be built (refused: nothing of it is ever
  published); both are named and fail the run (exit 1) -- the release tag is the one the CI plan
  publishes (platforms.publishable: over the platforms that are built, never a refused one);
- a cell whose alias already has that digest is left alone;
- any other cell is a candidate -- including one whose recipe was REVERTED to an immutable tag
  published long ago: the alias follows the recipe back (revert-safe), because candidates come
  from the recipe and the registry's answers, never from "what this run built";
- with ``--gate DIR`` the gate fails CLOSED: a candidate moves only when DIR holds a PASS
  record for exactly its digest from every check the digest requires (``required_checks``:
  the GPU tier on each platform of the image, and the vulnerability scan) and no failed
  record. What is required comes from the cells, never from which records happen to be in
  DIR: a GPU job that never ran (expired in the queue with no runner online, a runner whose
  python3 is too old for the suite) leaves no record, and a missing record holds the digest,
  named with the checks it lacks. Every candidate is decided before any alias moves, and one
  held candidate holds them all (exit 1): a run never leaves some cells promoted and others
  not on a verdict it has only half of.
After each retag the alias is read back and must have the digest; anything else is an error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..render import recipes as rendermod
from ..supply import vulnscan

from .platforms import publishable
from .publish import ALIAS, ZSTD
from .registry import RegistryError, split_registry


@dataclass
class Step:
    name: str
    immutable: str            # HOST/NS/NAME:TAG
    alias: str                # HOST/NS/NAME:latest
    digest: str | None        # of the immutable tag (None: not published)
    alias_digest: str | None  # of the alias now (None: no alias yet)
    required: tuple[str, ...]  # the gate checks its digest must pass (required_checks)
    twin_digest: str | None = None        # of TAG-zstd, where the cell publishes a zstd twin
    twin_alias_digest: str | None = None  # of latest-zstd now

    @property
    def by_digest(self) -> str:
        return f"{self.immutable.rsplit(':', 1)[0]}@{self.digest}"

    @property
    def state(self) -> str:
        if self.digest is None:
            return "unpublished"
        current = self.alias_digest == self.digest and self.twin_alias_digest == self.twin_digest
        return "current" if current else "candidate"


GPU_TIER = "gpu"   # gpu.yml's gpu job: the GPU tier of one digest on one platform's GPU runners


def gpu_check(platform: str) -> str:
    """The gate check of the GPU tier on ``platform``: gpu.yml's gpu job writes ``{"check":
    "gpu", "platform": ...}`` per platform it tested, since a multi-arch index is one digest
    tested on each platform's own runners, and one platform's pass says nothing of the other's."""
    return f"{GPU_TIER}[{platform}]"


def required_checks(platforms: Iterable[str]) -> tuple[str, ...]:
    """The checks a digest must pass before `latest` moves to it, from the platforms of the
    cells it publishes: the GPU tier on every one of them (every platform of matrix.yaml
    declares its GPU runners, ``gpu_runner_label``, and gpu.yml tests every planned cell on
    them: no cell is exempt) and the vulnerability scan of the digest (gpu.yml's scan job)."""
    names = sorted(set(platforms))
    if not names:
        raise ValueError("required_checks: no platform, so no GPU tier to require (a gate that asks nothing)")
    return (*(gpu_check(p) for p in names), vulnscan.CHECK)


def plan(cells: list[tuple[str, str]], registry_arg: str,
         digest: Callable[[str, str, str], str | None], platforms: dict[str, Iterable[str]]) -> list[Step]:
    """One step per (cell name, immutable tag): what the registry holds for both tags, and what
    the gate requires of it (``platforms``: cell name -> the platforms its tag publishes).
    ``digest(host, repo, tag)`` is registry.digest (an error, never a guess)."""
    host, ns = split_registry(registry_arg)
    steps = []
    for name, tag in cells:
        repo = f"{ns}/{name}"
        s = Step(name, f"{host}/{repo}:{tag}", f"{host}/{repo}:{ALIAS}", digest(host, repo, tag),
                 digest(host, repo, ALIAS), required_checks(platforms[name]))
        if s.digest is not None:
            s.twin_digest = digest(host, repo, f"{tag}{ZSTD}")
            s.twin_alias_digest = digest(host, repo, f"{ALIAS}{ZSTD}") if s.twin_digest else None
        steps.append(s)
    return steps


# ref (by digest) -> check -> passed: what the gate records say, and nothing about what they don't
Gate = dict[str, dict[str, bool]]


def read_gate(gate_dir: Path) -> Gate:
    """Every gate record in DIR (``*.json``, searched recursively: one artifact folder per job)
    holding ``{"ref": ..., "check": ..., "passed": ...}`` (no check: ``gpu``; a GPU record
    names its ``platform``, ``gpu_check``), by image reference (by digest) and check. A check
    with several records for one digest passed only when every one of them did."""
    records: Gate = {}
    for f in sorted(gate_dir.rglob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RegistryError(f"--gate {gate_dir}: {f.name} is not a gate record: {e}") from None
        if not isinstance(doc, dict) or "@sha256:" not in str(doc.get("ref", "")):
            continue
        check = str(doc.get("check") or GPU_TIER)
        if check == GPU_TIER and doc.get("platform"):
            check = gpu_check(str(doc["platform"]))
        prior = records.setdefault(doc["ref"], {}).get(check, True)
        records[doc["ref"]][check] = prior and doc.get("passed") is True
    return records


def verdict(gate: Gate, step: Step) -> tuple[list[str], list[str]]:
    """(missing, failed) for the step's digest: the required checks with no record for it, and
    every check with a failed record for it (required or not: a failure is never overlooked).
    Both empty: the digest passed the gate."""
    have = gate.get(step.by_digest, {})
    return [c for c in step.required if c not in have], sorted(c for c, ok in have.items() if not ok)


def promote(steps: list[Step], gate: Gate | None, retag: Callable[[str, str], None],
            digest: Callable[[str, str, str], str | None], out: TextIO) -> tuple[int, int]:
    """Retag every candidate, or -- when the gate holds any of them -- none; (promoted, held
    back). Every verdict is taken before the first retag, so a held cell never leaves the run
    half-promoted."""
    candidates = []
    for s in steps:
        if s.state == "unpublished":
            out.write(f"promote: {s.name}: {s.immutable} is not published: {ALIAS} left as it is\n")
        elif s.state == "current":
            out.write(f"promote: {s.name}: {ALIAS} is already {s.digest}\n")
        else:
            candidates.append(s)
    held = []
    for s in candidates if gate is not None else []:
        missing, failed = verdict(gate, s)
        if missing or failed:
            held.append(s.name)
            why = "; ".join(([f"missing {', '.join(missing)}"] if missing else [])
                            + ([f"failed {', '.join(failed)}"] if failed else []))
            out.write(f"promote: {s.name}: NOT promoted: the gate has no pass for {s.by_digest}: {why}\n")
    if held:
        for s in candidates:
            if s.name not in held:
                out.write(f"promote: {s.name}: passed the gate, NOT promoted: no alias moves while "
                          f"{', '.join(held)} {'is' if len(held) == 1 else 'are'} held\n")
        return 0, len(candidates)
    for s in candidates:
        # the zstd twin is the gated image recompressed (publish.py): it follows the same pass
        moves = [(s.by_digest, s.alias, s.digest, s.alias_digest)]
        if s.twin_digest:
            moves.append((f"{s.by_digest.split('@')[0]}@{s.twin_digest}", f"{s.alias}{ZSTD}", s.twin_digest,
                          s.twin_alias_digest))
        for src, alias, want, was in moves:
            if was == want:
                continue
            retag(src, alias)
            host, _, rest = alias.partition("/")
            repo, _, tag = rest.rpartition(":")
            now = digest(host, repo, tag)
            if now != want:
                raise RegistryError(f"promote: {s.name}: {alias} is {now} after the retag, expected {want}")
            out.write(f"promote: {s.name}: {alias.rsplit(':', 1)[1]} -> {want} (was {was or 'absent'})\n")
    return len(candidates), 0


def command(m: Matrix, root: Path, selected: list[Cell], registry_arg: str | None, gate_dir: Path | None,
            out: TextIO = sys.stdout) -> int:
    """`build.py --promote`: exit 0 when every selected repository is promoted or already
    current; 1 when the gate held any candidate back (each named with what it lacks; then none
    moved), or when a repository cannot be promoted -- nothing of it can be built, or its release
    tag is not in the registry -- named with why (the others still move: their verdicts are
    whole); an error (RegistryError) when the registry could not answer."""
    from . import registry

    if not registry_arg:
        raise TrainbaseError("--promote needs --registry HOST[:PORT]/NAMESPACE")
    if gate_dir is not None and not gate_dir.is_dir():
        raise TrainbaseError(f"--gate {gate_dir}: not a directory of gate records")
    rendered = rendermod.render_all(m, selected, root=root)
    # one step per repository, under the tag the CI plan publishes it: the platforms of one
    # recipe are one index, and a platform that is never built (refused) is not one of them
    releases = publishable(m, rendered, selected)
    for repo, r in sorted(releases.items()):
        if r.left_out:
            out.write(f"promote: {repo}: {'NOTHING can be published' if not r.cells else 'left out'}: {r.why_not()}\n")
    cells = [(repo, r.tag) for repo, r in releases.items() if r.tag]
    steps = plan(cells, registry_arg, registry.digest, {repo: r.platforms for repo, r in releases.items() if r.tag})
    gate = read_gate(gate_dir) if gate_dir is not None else None
    promoted, held = promote(steps, gate, registry.retag, registry.digest, out)
    out.write(f"promote: {promoted} promoted, {held} held back by the gate, "
              f"{sum(s.state == 'current' for s in steps)} already current, "
              f"{sum(s.state == 'unpublished' for s in steps)} not published\n")
    if held:
        out.write(f"promote: NOTHING promoted: the gate holds {held} candidate(s) until every required "
                  f"check has a pass record for its digest (see above)\n")
    unpromotable = sorted([repo for repo, r in releases.items() if not r.tag]
                          + [s.name for s in steps if s.state == "unpublished"])
    if unpromotable:
        out.write(f"promote: FAILED: {len(unpromotable)} repository(ies) cannot be promoted, no published "
                  f"release tag (see above): {', '.join(unpromotable)}\n")
    return 1 if held or unpromotable else 0
