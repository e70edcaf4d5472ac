"""`build.py --prune`: local image tags of recipes that are no longer current."""

from __future__ import annotations

import re
from pathlib import Path

from trainbase_common import engine

from ..define.matrix import Matrix
from ..render import recipes as rendermod


def prune(m: Matrix, root: Path) -> int:
    """Old recipes pile up (a CUDA framework image is 5-8 GB): remove every local
    NAMESPACE/<cell>:r<hash> that is not the current recipe of its cell."""
    rendered = rendermod.render_all(m, root=root)
    ns = m.spec.naming.namespace
    current = {f"{ns}/{name}:{r.tag}" for name, r in rendered.items()}
    out = engine.list_tags(f"{ns}/*")
    stale = [ref for ref in out if re.search(r":r[0-9a-f]{12}$", ref) and ref not in current]
    for ref in stale:
        engine.remove_image(ref)
        print(f"removed  {ref}")
    print(f"pruned {len(stale)} stale image tag(s); {len(out) - len(stale)} kept")
    return 0
