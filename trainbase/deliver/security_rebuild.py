"""`python -m trainbase.deliver.security_rebuild`: the scheduled security check
(trainbase/supply/security_check.py) over the SBOMs of what users pull -- attached to each
published `latest` in the registry (--registry, --profile) or given as files -- and, with
--write, the rebuild epoch of each OS row with a pending fix (locks/security-rebuilds.json).

    python -m trainbase.deliver.security_rebuild [SBOM.cdx.json...] [--registry R --profile P]
        [--write] [--today YYYY-MM-DD]

Exit 0 with or without findings (the table says), and when nothing is published yet (a new
registry's first week: said so); 2 when an index or an SBOM cannot be read, or when no
published image has one -- never a silent "nothing pending". A published image without an SBOM
(promoted before promotion required its attestations) is named, with a warning, and the others
are still checked: one such image must not stop every security rebuild and refresh.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path

from ..errors import TrainbaseError
from ..supply import security_check


def main(argv: list[str] | None = None) -> int:
    from ..define import security_rebuilds

    p = argparse.ArgumentParser(
        prog="python -m trainbase.deliver.security_rebuild", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("sboms", nargs="*", type=Path)
    p.add_argument(
        "--registry",
        metavar="HOST[:PORT]/NAMESPACE",
        help="also check the SBOM attached to each --profile cell's published latest",
    )
    p.add_argument("--profile", default="production")
    p.add_argument(
        "--write",
        action="store_true",
        help=f"bump the epoch of each row with a pending fix in {security_rebuilds.FILE}",
    )
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--today", type=date.fromisoformat, default=date.today())
    a = p.parse_args(argv)
    missing: list[str] = []  # published images without an SBOM: named, the others checked
    try:
        sboms = list(a.sboms)
        if a.registry:
            from ..define.matrix import load
            from .attest import fetch_sboms

            m = load(a.root / "matrix.yaml")
            sboms += fetch_sboms(
                m, a.root, m.select({}, a.profile), a.registry, a.root / "reports" / "security-sboms", missing=missing
            )
            for why in missing:
                print(f"::warning title=no SBOM::{why}")
            if missing and not sboms:
                raise TrainbaseError(f"no published image has an SBOM to check ({len(missing)} without one)")
            if not sboms:
                # a new registry's first week: no `latest` yet (fetch_sboms named each cell).
                # Said, and not an error: the refresh must still bump, lock and open its pull request
                print(f"security check: nothing published under {a.registry} yet (no latest): nothing to check")
                return 0
        if not sboms:
            raise TrainbaseError("nothing to check: name SBOM files or --registry")
        rows = security_check.check(sboms, a.today)
        if a.write and rows:
            current = security_rebuilds.load(a.root)
            security_rebuilds.write(a.root, {**current, **rows})
    except TrainbaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"security check: {len(rows)} OS row(s) to rebuild" + (f": {', '.join(sorted(rows))}" if rows else ""))
    if rows and a.write:
        print(
            f"{security_rebuilds.FILE}: epoch {a.today} for {', '.join(sorted(rows))} "
            "(render: `python build.py render`)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
