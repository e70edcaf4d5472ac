"""Promotion: `build.py --promote --registry HOST[:PORT]/NAMESPACE [--gate DIR]`.

Publishing (publish.py) pushes immutable tags only: they are the staging area, nothing a user
pulls by name moves. Promotion then points each cell's moving alias (`latest`) at the digest of
the cell's CURRENT recipe tag, registry side, by digest (`skopeo copy` of the manifest: no
layer moves, no local image is involved, so no job can race another's push):

- a cell whose current immutable tag is not in the registry keeps its alias where it is;
- a cell whose alias already has that digest is left alone;
- any other cell is a candidate -- including one whose recipe was REVERTED to an immutable tag
  published long ago: the alias follows the recipe back (revert-safe), because candidates come
  from the recipe and the registry's answers, never from "what this run built";
- with ``--gate DIR``, a candidate is promoted only when DIR holds a pass for exactly its
  digest (the GPU tier writes one per tested image: gpu.yml); the rest are named and left.
After each retag the alias is read back and must have the digest; anything else is an error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..render import recipes as rendermod

from .publish import ALIAS, ZSTD, releases
from .registry import RegistryError, split_registry


@dataclass
class Step:
    name: str
    immutable: str            # HOST/NS/NAME:TAG
    alias: str                # HOST/NS/NAME:latest
    digest: str | None        # of the immutable tag (None: not published)
    alias_digest: str | None  # of the alias now (None: no alias yet)
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


def plan(cells: list[tuple[str, str]], registry_arg: str,
         digest: Callable[[str, str, str], str | None]) -> list[Step]:
    """One step per (cell name, immutable tag): what the registry holds for both tags.
    ``digest(host, repo, tag)`` is registry.digest (an error, never a guess)."""
    host, ns = split_registry(registry_arg)
    steps = []
    for name, tag in cells:
        repo = f"{ns}/{name}"
        s = Step(name, f"{host}/{repo}:{tag}", f"{host}/{repo}:{ALIAS}", digest(host, repo, tag),
                 digest(host, repo, ALIAS))
        if s.digest is not None:
            s.twin_digest = digest(host, repo, f"{tag}{ZSTD}")
            s.twin_alias_digest = digest(host, repo, f"{ALIAS}{ZSTD}") if s.twin_digest else None
        steps.append(s)
    return steps


def read_gate(gate_dir: Path) -> set[str]:
    """The image references (by digest) the gate passed, from every ``*.json`` in DIR (searched
    recursively: one artifact folder per job) holding ``{"ref": ..., "passed": ..., "check":
    ...}`` (no check: ``gpu``, the GPU tier's). Every check that left a record for any image
    must have passed for an image, and none may have failed: a digest the vulnerability scan
    failed is held back even though its GPU tier passed, and one it never scanned too."""
    results: dict[str, dict[str, bool]] = {}
    checks: set[str] = set()
    for f in sorted(gate_dir.rglob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RegistryError(f"--gate {gate_dir}: {f.name} is not a gate record: {e}") from None
        if not isinstance(doc, dict) or "@sha256:" not in str(doc.get("ref", "")):
            continue
        check = str(doc.get("check") or "gpu")
        checks.add(check)
        prior = results.setdefault(doc["ref"], {}).get(check, True)
        results[doc["ref"]][check] = prior and doc.get("passed") is True
    return {ref for ref, by in results.items() if set(by) == checks and all(by.values())}


def promote(steps: list[Step], gate: set[str] | None, retag: Callable[[str, str], None],
            digest: Callable[[str, str, str], str | None], out: TextIO) -> tuple[int, int]:
    """Retag every candidate the gate passed; (promoted, held back)."""
    promoted = held = 0
    for s in steps:
        if s.state == "unpublished":
            out.write(f"promote: {s.name}: {s.immutable} is not published: {ALIAS} left as it is\n")
            continue
        if s.state == "current":
            out.write(f"promote: {s.name}: {ALIAS} is already {s.digest}\n")
            continue
        if gate is not None and s.by_digest not in gate:
            held += 1
            out.write(f"promote: {s.name}: NOT promoted: the gate has no pass for {s.by_digest}\n")
            continue
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
        promoted += 1
    return promoted, held


def command(m: Matrix, root: Path, selected: list[Cell], registry_arg: str | None, gate_dir: Path | None,
            out: TextIO = sys.stdout) -> int:
    """`build.py --promote`: exit 0 when every candidate was promoted, 1 when the gate held
    some back (named), an error (RegistryError) when the registry could not answer."""
    from . import registry

    if not registry_arg:
        raise TrainbaseError("--promote needs --registry HOST[:PORT]/NAMESPACE")
    if gate_dir is not None and not gate_dir.is_dir():
        raise TrainbaseError(f"--gate {gate_dir}: not a directory of gate records")
    rendered = rendermod.render_all(m, selected, root=root)
    # one step per repository: the platforms of one recipe are one index (publish.releases)
    cells = list(releases([(c.image or c.name, rendered[c.name].tag) for c in selected]).items())
    steps = plan(cells, registry_arg, registry.digest)
    gate = read_gate(gate_dir) if gate_dir is not None else None
    promoted, held = promote(steps, gate, registry.retag, registry.digest, out)
    out.write(f"promote: {promoted} promoted, {held} held back by the gate, "
              f"{sum(s.state == 'current' for s in steps)} already current, "
              f"{sum(s.state == 'unpublished' for s in steps)} not published\n")
    return 1 if held else 0
