"""`build.py --bump [PACKAGE ...]`: adopt upstream's new releases in one command.

For each PyPI pin of matrix.yaml that has a newer release in its own series (what
`--outdated` calls a series bump) and that no hold of matrix.yaml keeps back, the pin is
rewritten in place (the text of matrix.yaml, so comments and anchors stay), the matrix is
loaded again -- a bump that makes a cell impossible (an NCCL wheel that no longer agrees with
its row's `nccl`, a schema rule) is refused naming the cell and the rule's reason, and nothing
is written -- then the stale pip locks are re-resolved, everything is rendered, and the cells
whose immutable tags move are printed. A newer *series* (torch 2.15 -> 2.16) is a new release
entry with its own CUDA rows and size (docs/matrix.md): named, never written by this command.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import yaml

from trainbase_common import safe_io

from ..define import outdated
from ..errors import MatrixError, TrainbaseError

if TYPE_CHECKING:
    from ..define.matrix import Matrix
    from ..define.pip_locks import LockSet

Locker = Callable[[Path, "list[LockSet]", TextIO], None]


@dataclass
class Edit:
    package: str
    old: str
    new: str
    where: list[str]


def plan(findings: list[outdated.Finding], packages: list[str]) -> tuple[list[Edit], list[str]]:
    """(series bumps to write, lines about what is left to a person)."""
    wanted = {outdated._norm(p) for p in packages}
    edits, notes = [], []
    for f in findings:
        if wanted and f.pin.package not in wanted:
            continue
        if f.error:
            notes.append(f"{f.pin.package} {f.pin.version}: PyPI did not answer ({f.error})")
            continue
        # a package named on the command line goes to its newest release (a person chose it);
        # otherwise only within its series, the bump that keeps compatibility
        target = f.newest if (wanted and f.newest) else f.newest_in_series
        if target:
            edits.append(Edit(f.pin.package, f.pin.version, target, f.pin.where))
        if f.newest and f.newest != target:
            notes.append(
                f"{f.pin.package} {f.pin.version}: newer series {f.newest}: `--bump {f.pin.package}` "
                f"writes it (a framework or CUDA version is a new entry instead, docs/matrix.md)"
            )
        if f.held:
            notes.append(f"{f.pin.package} {f.pin.version}: {f.held}")
    if wanted - {f.pin.package for f in findings}:
        raise TrainbaseError(
            f"--bump: matrix.yaml pins no {', '.join(sorted(wanted - {f.pin.package for f in findings}))}"
        )
    return edits, notes


def apply(text: str, edits: list[Edit]) -> str:
    """matrix.yaml's text with each pin rewritten where it is written, and only there (two CUDA
    rows may pin the same cuDNN, one of them held): ``NAME==OLD`` in a package list,
    ``{package: NAME, version: OLD}`` in a wheel table."""
    for e in edits:
        name = re.escape(e.package).replace(r"\-", "[-_.]")
        pin = re.compile(rf"(?i)(?<![\w.-])({name}==){re.escape(e.old)}(?![\w.])")
        table = re.compile(rf"(?i)(package:\s*['\"]?{name}['\"]?\s*,\s*version:\s*['\"]?){re.escape(e.old)}(?![\w.])")
        for where in e.where:
            text, n = _sub_at(text, where, (pin, table), e.new)
            if n == 0:
                raise TrainbaseError(
                    f"--bump: {e.package}=={e.old} is pinned at {where} in a form this "
                    f"command does not rewrite; edit it by hand"
                )
            if m := re.fullmatch(r"cuda\.(.+)\.wheels\.nccl", where):
                # a CUDA row's `nccl:` moves with its NCCL wheel: the two state one fact (the
                # image's NCCL), so a wheel bump is the row's bump. Whether a framework release
                # of the row still agrees is then the matrix's own rule, which names it.
                scalar = re.compile(rf"^(['\"]?){re.escape(e.old)}(?![\w.])")
                text, _ = _sub_at(text, f"cuda.{m.group(1)}.nccl", (scalar,), e.new)
    return text


def _sub_at(text: str, where: str, patterns: Iterable[re.Pattern[str]], new: str) -> tuple[str, int]:
    """``text`` with ``patterns`` replaced only inside the node at ``where`` (a path as
    ``--outdated`` prints it: ``cuda.12.9.wheels.cudnn``, ``python.packages[0]``)."""
    node = _node_at(yaml.compose(text), where)
    if node is None:
        return text, 0
    a, b = node.start_mark.index, node.end_mark.index
    span, count = text[a:b], 0
    for p in patterns:
        span, n = p.subn(rf"\g<1>{new}", span)
        count += n
    return text[:a] + span + text[b:], count


def _node_at(node: yaml.Node | None, where: str) -> yaml.Node | None:
    """The composed YAML node at ``where``; mapping keys may hold dots ("12.9"), so the
    longest key that fits the rest of the path is taken."""
    rest = where
    while rest:
        if isinstance(node, yaml.SequenceNode) and (m := re.match(r"\[(\d+)\]\.?", rest)):
            node, rest = node.value[int(m.group(1))], rest[m.end() :]
        elif isinstance(node, yaml.MappingNode):
            fits = [(k, v) for k, v in node.value if rest == k.value or rest.startswith((k.value + ".", k.value + "["))]
            if not fits:
                return None
            k, node = max(fits, key=lambda kv: len(kv[0].value))
            rest = rest[len(k.value) :].lstrip(".")
        else:
            return None
    return node


def refused(before: Matrix, after: Matrix) -> list[str]:
    """The cells a bump would make impossible: included before, excluded after, with why."""
    was = {c.name for c in before.included}
    return [f"{c.name}: {c.excluded}" for c in after.cells if c.excluded and c.name in was]


def command(
    matrix_path: Path,
    packages: list[str],
    dry_run: bool,
    out: TextIO,
    releases: Callable[[str], list[str]] = outdated.fetch_releases,
    lock: Locker | None = None,
) -> int:
    from ..define.matrix import load
    from . import recipes as rendermod

    root = matrix_path.resolve().parent
    before = load(matrix_path)
    edits, notes = plan(outdated.check(matrix_path, releases), packages)
    for e in edits:
        out.write(
            f"bump: {e.package} {e.old} -> {e.new}  ({', '.join(e.where[:3])}{' ...' if len(e.where) > 3 else ''})\n"
        )
    for n in notes:
        out.write(f"  not bumped: {n}\n")
    if not edits:
        out.write("bump: nothing to bump\n")
        return 0
    original = matrix_path.read_text()
    # each bump on its own first, so one that breaks a rule is refused by name and the rest go on
    accepted = []
    for e in edits:
        if why := _breaks(before, matrix_path, apply(original, [e]), load):
            out.write(f"bump: REFUSED {e.package} {e.old} -> {e.new}: {'; '.join(why)}\n")
        else:
            accepted.append(e)
    text = apply(original, accepted)
    if accepted and (why := _breaks(before, matrix_path, text, load)):
        out.write(f"bump: REFUSED together, nothing written: {'; '.join(why)}\n")
        return 1
    if len(accepted) < len(edits):
        out.write(f"bump: {len(edits) - len(accepted)} bump(s) refused (above): each breaks a rule of matrix.yaml\n")
    if not accepted:
        return 1
    if dry_run:
        out.write(f"bump: --dry-run: matrix.yaml unchanged ({len(accepted)} pin(s) would move)\n")
        return 1 if len(accepted) < len(edits) else 0
    old_tags = {n: r.tag for n, r in rendermod.render_all(before, root=root).items()}
    locks = {f: f.read_bytes() for f in (root / "locks").glob("*")}
    safe_io.atomic_write(matrix_path, text)
    m = load(matrix_path)
    rendered = rendermod.render_all(m, root=root)
    try:
        (lock or _lock)(root, rendermod.lock_sets(rendered), out)
    except TrainbaseError as e:
        # pip's resolver is the compatibility rule of last resort (a framework wheel that pins
        # cuBLAS exactly): nothing of the bump stays, not even the locks that did resolve
        safe_io.atomic_write(matrix_path, original)
        for f in (root / "locks").glob("*"):
            if f not in locks:
                f.unlink()
        for f, data in locks.items():
            safe_io.atomic_write(f, data)
        raise TrainbaseError(
            f"--bump: REFUSED, matrix.yaml and locks/ restored: the bumped pins do not resolve together:\n{e}"
        ) from None
    rendered = rendermod.render_all(m, root=root)
    changed, removed = rendermod.write(rendered, root)
    moved = sorted(n for n, r in rendered.items() if old_tags.get(n) not in (None, r.tag))
    out.write(
        f"bump: {len(accepted)} pin(s) written; {len(moved)} cell(s) move to a new tag "
        f"({len(changed)} rendered file set(s) changed):\n"
    )
    for n in moved:
        out.write(f"  {n}: {old_tags[n]} -> {rendered[n].tag}\n")
    if stale := rendermod.missing_locks(rendered, root):
        raise TrainbaseError(f"--bump: locks still stale after resolving: {', '.join(stale)}")
    return 1 if len(accepted) < len(edits) else 0


def _breaks(before: Matrix, matrix_path: Path, text: str, load: Callable[[Path], Matrix]) -> list[str]:
    """What ``text`` as matrix.yaml would break: a schema rule, or cells made impossible."""
    trial = matrix_path.resolve().parent / f".{matrix_path.name}.bump"
    try:
        trial.write_text(text)
        return refused(before, load(trial))
    except MatrixError as e:  # a rule of the schema itself (a row's nccl and its wheel disagree)
        return [str(e).replace(trial.name, matrix_path.name)]
    finally:
        trial.unlink(missing_ok=True)


def _lock(root: Path, sets: list[LockSet], out: TextIO) -> None:
    from ..define import pip_locks

    written = pip_locks.write(root, sets, log=lambda s: out.write(f"  {s}\n"))
    removed = pip_locks.remove_orphans(root, sets)
    out.write(
        f"bump: {len(written)} lock file(s) re-resolved"
        + (f", {len(removed)} no cell uses removed" if removed else "")
        + "\n"
    )
