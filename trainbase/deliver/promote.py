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
  the GPU tier on each platform of the image, and the vulnerability scan -- of each platform's
  manifest, for a multi-arch index) and no failed record. What is required comes from the
  cells, never from which records happen to be in DIR: a GPU job that never ran (expired in the
  queue with no runner online, a runner whose python3 is too old for the suite) leaves no
  record, and a missing record holds the digest, named with the checks it lacks;
- attested before promoted: a candidate whose signed SBOM and provenance do not verify on the
  digest (on every platform manifest of an index: attest.attestation_problems) is held, named
  with what is missing; the next build attests it (the plan keeps a published digest that
  lacks them: ci_matrix.with_registry_state), and the next promotion moves it;
- each repository is promoted or held on ITS OWN verdict: a flaky GPU cell, an offline pool or
  a new critical CVE holds the repository it concerns, named, and the others still move (the
  security rebuild of one OS row must not wait for an unrelated red cell). Every verdict is
  still taken before the first retag;
- the ``-zstd`` twin's alias (``latest-zstd``) moves only on records for the twin's OWN digest
  (its scan on each platform: its layers are other bytes) and its own attestations; without
  them it stays where it is, said, while ``latest`` moves;
- only main's head recipe moves an alias (``--head-sha``): a run whose recipe commit
  (``--recipe-sha``, default the checkout's HEAD) is not main's head -- a re-run of an older
  run's flaky GPU job, a dispatch from another branch -- promotes nothing, and says so; the
  run for the head commit promotes (or the nightly), so `latest` never moves backwards.
Compare and swap: just before each retag the alias is read again, and if it no longer holds the
digest the verdicts were taken on (another promotion moved it), the run stops naming both. After
each retag the alias is read back and must have the digest; anything else is an error.
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
    immutable: str  # HOST/NS/NAME:TAG
    alias: str  # HOST/NS/NAME:latest
    digest: str | None  # of the immutable tag (None: not published)
    alias_digest: str | None  # of the alias now (None: no alias yet)
    required: tuple[str, ...]  # the gate checks its digest must pass (required_checks)
    twin_digest: str | None = None  # of TAG-zstd, where the cell publishes a zstd twin
    twin_alias_digest: str | None = None  # of latest-zstd now
    twin_required: tuple[str, ...] = ()  # the checks the twin's own digest must pass (twin_checks)

    @property
    def by_digest(self) -> str:
        return f"{self.immutable.rsplit(':', 1)[0]}@{self.digest}"

    @property
    def twin_by_digest(self) -> str:
        return f"{self.immutable.rsplit(':', 1)[0]}@{self.twin_digest}"

    @property
    def state(self) -> str:
        if self.digest is None:
            return "unpublished"
        current = self.alias_digest == self.digest and self.twin_alias_digest == self.twin_digest
        return "current" if current else "candidate"


GPU_TIER = "gpu"  # gpu.yml's gpu job: the GPU tier of one digest on one platform's GPU runners


def gpu_check(platform: str) -> str:
    """The gate check of the GPU tier on ``platform``: gpu.yml's gpu job writes ``{"check":
    "gpu", "platform": ...}`` per platform it tested, since a multi-arch index is one digest
    tested on each platform's own runners, and one platform's pass says nothing of the other's."""
    return f"{GPU_TIER}[{platform}]"


def scan_check(platform: str) -> str:
    """The gate check of the vulnerability scan of ``platform``'s manifest: a scanner given an
    index scans ONE platform (Trivy: the runner's, unless told), so each platform of a
    multi-arch index needs its own record (gpu.yml's scan job: one per platform, with it)."""
    return f"{vulnscan.CHECK}[{platform}]"


def required_checks(platforms: Iterable[str]) -> tuple[str, ...]:
    """The checks a digest must pass before `latest` moves to it, from the platforms of the
    cells it publishes: the GPU tier on every one of them (every platform of matrix.yaml
    declares its GPU runners, ``gpu_runner_label``, and gpu.yml tests every planned cell on
    them: no cell is exempt) and the vulnerability scan (gpu.yml's scan job) -- of each
    platform's manifest where the digest is a multi-arch index."""
    names = sorted(set(platforms))
    if not names:
        raise ValueError("required_checks: no platform, so no GPU tier to require (a gate that asks nothing)")
    scans = [scan_check(p) for p in names] if len(names) > 1 else [vulnscan.CHECK]
    return (*(gpu_check(p) for p in names), *scans)


def twin_checks(platforms: Iterable[str]) -> tuple[str, ...]:
    """What the zstd twin's OWN digest must pass before `latest-zstd` moves to it: the scan of
    each platform (its layers are other blobs, so a record for the gzip digest names nothing a
    pull of `latest-zstd` gets). The GPU tier is not repeated: the twin holds the same files,
    recompressed (publish.py), and the engine runs what it unpacks."""
    names = sorted(set(platforms))
    return tuple(scan_check(p) for p in names) if len(names) > 1 else (vulnscan.CHECK,)


def plan(
    cells: list[tuple[str, str]],
    registry_arg: str,
    digest: Callable[[str, str, str], str | None],
    platforms: dict[str, Iterable[str]],
) -> list[Step]:
    """One step per (cell name, immutable tag): what the registry holds for both tags, and what
    the gate requires of it (``platforms``: cell name -> the platforms its tag publishes).
    ``digest(host, repo, tag)`` is registry.digest (an error, never a guess)."""
    host, ns = split_registry(registry_arg)
    steps = []
    for name, tag in cells:
        repo = f"{ns}/{name}"
        s = Step(
            name,
            f"{host}/{repo}:{tag}",
            f"{host}/{repo}:{ALIAS}",
            digest(host, repo, tag),
            digest(host, repo, ALIAS),
            required_checks(platforms[name]),
        )
        if s.digest is not None:
            s.twin_digest = digest(host, repo, f"{tag}{ZSTD}")
            s.twin_alias_digest = digest(host, repo, f"{ALIAS}{ZSTD}") if s.twin_digest else None
            s.twin_required = twin_checks(platforms[name]) if s.twin_digest else ()
        steps.append(s)
    return steps


# ref (by digest) -> check -> passed: what the gate records say, and nothing about what they don't
Gate = dict[str, dict[str, bool]]


def read_gate(gate_dir: Path) -> Gate:
    """Every gate record in DIR (``*.json``, searched recursively: one artifact folder per job)
    holding ``{"ref": ..., "check": ..., "passed": ...}`` (no check: ``gpu``; a GPU record
    names its ``platform``, ``gpu_check``; a scan record of one platform's manifest names it
    too, ``scan_check``), by image reference (by digest) and check. A check with several
    records for one digest passed only when every one of them did."""
    records: Gate = {}
    for f in sorted(gate_dir.rglob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            # bad input, not the registry's answer: exit 2, one line naming the file
            raise TrainbaseError(f"--gate {gate_dir}: {f.name} is not a gate record: {e}") from None
        if not isinstance(doc, dict) or "@sha256:" not in str(doc.get("ref", "")):
            continue
        check = str(doc.get("check") or GPU_TIER)
        if check in (GPU_TIER, vulnscan.CHECK) and doc.get("platform"):
            check = f"{check}[{doc['platform']}]"
        prior = records.setdefault(doc["ref"], {}).get(check, True)
        records[doc["ref"]][check] = prior and doc.get("passed") is True
    return records


def verdict(gate: Gate, step: Step, twin: bool = False) -> tuple[list[str], list[str]]:
    """(missing, failed) for the step's digest (``twin``: its zstd twin's): the required checks
    with no record for it, and every check with a failed record for it (required or not: a
    failure is never overlooked). Both empty: the digest passed the gate."""
    have = dict(gate.get(step.twin_by_digest if twin else step.by_digest, {}))
    required = step.twin_required if twin else step.required
    # a single-platform digest: its scan record may name the platform (gpu.yml writes it) or not
    platforms = [c[len(GPU_TIER) + 1 : -1] for c in step.required if c.startswith(f"{GPU_TIER}[")]
    if len(platforms) == 1 and scan_check(platforms[0]) in have:
        have[vulnscan.CHECK] = have.get(vulnscan.CHECK, True) and have.pop(scan_check(platforms[0]))
    return [c for c in required if c not in have], sorted(c for c, ok in have.items() if not ok)


# the attestation check: a digest (HOST/REPO@sha256:...) -> what is not verified on it (empty: attested)
Attested = Callable[[str], list[str]]


def _why(missing: list[str], failed: list[str]) -> str:
    return "; ".join(
        ([f"missing {', '.join(missing)}"] if missing else []) + ([f"failed {', '.join(failed)}"] if failed else [])
    )


def stale(recipe_sha: str, head_sha: str) -> str:
    """Why a run whose recipe is commit RECIPE_SHA may move no alias ('' when it may): only
    main's head recipe moves `latest`. A re-run of an older run (its flaky GPU job passing a
    day later) would otherwise move the alias back to an older recipe's digest."""
    if not head_sha:
        return ""
    if not recipe_sha:
        return f"the run's recipe commit is unknown and main's head is {head_sha[:12]}"
    if recipe_sha != head_sha:
        return (
            f"this run's recipe is commit {recipe_sha[:12]}, main's head is {head_sha[:12]}: "
            "only the head's recipe moves an alias (its own run, or the nightly, promotes it)"
        )
    return ""


def promote(
    steps: list[Step],
    gate: Gate | None,
    retag: Callable[[str, str], None],
    digest: Callable[[str, str, str], str | None],
    out: TextIO,
    attested: Attested | None = None,
    recipe_sha: str = "",
    head_sha: str = "",
) -> tuple[int, int]:
    """Retag each candidate that passed the gate and whose attestations verify (``attested``);
    hold each other one, named with why -- a held repository holds only itself. (promoted,
    held back). Every verdict is taken before the first retag. A run whose recipe is not
    main's head (``stale``) moves nothing."""
    candidates = []
    for s in steps:
        if s.state == "unpublished":
            out.write(f"promote: {s.name}: {s.immutable} is not published: {ALIAS} left as it is\n")
        elif s.state == "current":
            out.write(f"promote: {s.name}: {ALIAS} is already {s.digest}\n")
            failed = verdict(gate, s)[1] if gate is not None else []
            if failed:
                # a promoted digest found wanting later (the nightly re-test: a new critical CVE):
                # no older digest is better, so the alias stays; the security rebuild replaces it
                out.write(
                    f"promote: {s.name}: WARNING: the {ALIAS} digest now FAILS {', '.join(failed)}: it stays "
                    "until a rebuild passes (the security rebuild of its OS row)\n"
                )
        else:
            candidates.append(s)
    why_stale = stale(recipe_sha, head_sha)
    if why_stale and candidates:
        out.write(f"promote: NOTHING promoted, {len(candidates)} candidate(s) left as they are: {why_stale}\n")
        return 0, 0
    held, moves = [], []
    for s in candidates:
        missing, failed = verdict(gate, s) if gate is not None else ([], [])
        problems = attested(s.by_digest) if attested is not None else []
        if missing or failed:
            out.write(
                f"promote: {s.name}: NOT promoted: the gate has no pass for {s.by_digest}: {_why(missing, failed)}\n"
            )
        if problems:
            out.write(
                f"promote: {s.name}: NOT promoted: {s.by_digest} is not attested: {'; '.join(problems)} "
                "(the next build attests it)\n"
            )
        if missing or failed or problems:
            held.append(s)
            continue
        moves.append((s, s.by_digest, s.alias, s.digest, s.alias_digest))
        if s.twin_digest and s.twin_alias_digest != s.twin_digest:
            # the twin is another digest: its alias moves on ITS records and attestations only
            t_missing, t_failed = verdict(gate, s, twin=True) if gate is not None else ([], [])
            t_problems = attested(s.twin_by_digest) if attested is not None else []
            if t_missing or t_failed or t_problems:
                why = "; ".join(filter(None, [_why(t_missing, t_failed), "; ".join(t_problems)]))
                out.write(
                    f"promote: {s.name}: {ALIAS}{ZSTD} left at {s.twin_alias_digest or 'absent'}: its own "
                    f"digest {s.twin_by_digest} is not cleared: {why}\n"
                )
            else:
                moves.append((s, s.twin_by_digest, f"{s.alias}{ZSTD}", s.twin_digest, s.twin_alias_digest))
    for s, src, alias, want, was in moves:
        if was == want:
            continue
        host, _, rest = alias.partition("/")
        repo, _, tag = rest.rpartition(":")
        # compare, then swap (issue 64): the verdicts were taken on what the alias held at plan
        # time; another promotion (a re-run, the nightly) or a hand retag may have moved it since,
        # and overwriting that would be a move nobody judged. A registry has no conditional
        # manifest PUT, so the window is this read to the retag, and the read-back below.
        before = digest(host, repo, tag)
        if before == want:
            out.write(f"promote: {s.name}: {tag} is already {want} (moved there since the plan)\n")
            continue
        if before != was:
            raise RegistryError(
                f"promote: {s.name}: {alias} moved since the plan: it held {was or 'nothing'}, it holds "
                f"{before or 'nothing'} now (another promotion or a hand retag moved it); {alias} left as it "
                "is, the rest of this run stopped: promote again to plan from what the registry holds"
            )
        retag(src, alias)
        now = digest(host, repo, tag)
        if now != want:
            raise RegistryError(f"promote: {s.name}: {alias} is {now} after the retag, expected {want}")
        out.write(f"promote: {s.name}: {alias.rsplit(':', 1)[1]} -> {want} (was {was or 'absent'})\n")
    return len(candidates) - len(held), len(held)


def command(
    m: Matrix,
    root: Path,
    selected: list[Cell],
    registry_arg: str | None,
    gate_dir: Path | None,
    out: TextIO = sys.stdout,
    head_sha: str = "",
    recipe_sha: str = "",
    public_key: str | None = None,
    attestations: bool = True,
    attested_by: str = "",
) -> int:
    """`build.py --promote`: exit 0 when every selected repository is promoted or already
    current, or when the run's recipe is not main's head (``--head-sha``: nothing moves, said);
    1 when the gate or the attestation check held a candidate (each named with what it lacks;
    the others moved), or when a repository cannot be promoted -- nothing of it can be built, or
    its release tag is not in the registry -- named with why; an error (RegistryError) when the
    registry could not answer. ``public_key``: the attestations must be signed by it; without
    one, the keyless Sigstore bundles CI attaches must be there, each about the digest, and --
    with ``attested_by`` (OWNER/REPO) -- signed by that repository's build-cells.yml."""
    from . import attest, registry

    if not registry_arg:
        raise TrainbaseError("--promote needs --registry HOST[:PORT]/NAMESPACE")
    if gate_dir is not None and not gate_dir.is_dir():
        raise TrainbaseError(f"--gate {gate_dir}: not a directory of gate records")
    if head_sha and not recipe_sha:
        recipe_sha = _checkout_head(root)
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
    check = attest.attestation_check(public_key, attested_by) if attestations else None
    promoted, held = promote(
        steps, gate, registry.retag, registry.digest, out, attested=check, recipe_sha=recipe_sha, head_sha=head_sha
    )
    out.write(
        f"promote: {promoted} promoted, {held} held back, "
        f"{sum(s.state == 'current' for s in steps)} already current, "
        f"{sum(s.state == 'unpublished' for s in steps)} not published\n"
    )
    if held:
        out.write(
            f"promote: HELD: {held} repository(ies) stay where they are until every required check has a "
            f"pass record for its digest and its attestations verify (see above); the others moved\n"
        )
    unpromotable = sorted(
        [repo for repo, r in releases.items() if not r.tag] + [s.name for s in steps if s.state == "unpublished"]
    )
    if unpromotable:
        out.write(
            f"promote: FAILED: {len(unpromotable)} repository(ies) cannot be promoted, no published "
            f"release tag (see above): {', '.join(unpromotable)}\n"
        )
    return 1 if held or unpromotable else 0


def _checkout_head(root: Path) -> str:
    """The commit of the checkout whose recipes this run renders (the run's recipe commit)."""
    import subprocess

    p = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60, check=False
    )
    if p.returncode != 0:
        raise TrainbaseError(f"--head-sha: cannot read the checkout's commit ({p.stderr.strip()}): pass --recipe-sha")
    return p.stdout.strip()
