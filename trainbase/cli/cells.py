"""What ``build.py list`` and ``build.py explain`` say about a cell: its record (the JSON
``list --json`` prints), its FROM level, and a cell found by any name it has or could have had."""

from __future__ import annotations

import itertools
from typing import Any

from ..define.matrix import Cell, Matrix
from ..render import recipes as rendermod


def cell_record(m: Matrix, c: Cell, rendered: dict[str, rendermod.Rendered] | None = None) -> dict[str, Any]:
    rec = {
        "name": c.name,
        "dockerfile": f"{rendermod.IMAGES_DIR}/{c.name}/Dockerfile" if not c.excluded else None,
        "axes": c.axes,
        "framework_version": c.framework_version,
        "parent": c.parent,
        "profiles": list(c.profiles),
        "level": level(m, c),
        "excluded": c.excluded,
    }
    if rendered and c.name in rendered:
        r = rendered[c.name]
        rec["tag"] = r.tag
        rec["image"] = f"{m.spec.naming.namespace}/{c.name}:{r.tag}"
        chain: list[str] = []
        x: rendermod.Rendered | None = r
        while x is not None:  # a cell cannot build while anything under it is pending
            chain += [a for a in x.context.artifacts if m.spec.artifacts[a].file_for(x.cell.platform).pending]
            x = rendered.get(x.cell.parent) if x.cell.parent else None
        rec["artifacts_pending"] = sorted(set(chain))
    return rec


def level(m: Matrix, c: Cell) -> int:
    """Depth in the FROM chain: 0 for base cells. CI fans out level by level."""
    return 0 if not c.parent else 1 + level(m, m.cell(c.parent))


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
    return [
        "".join(fmt(framework=fw, framework_version=v) for fw, v in zip(chain, combo, strict=True)) + x.name
        for combo in itertools.product(*versions)
    ]
