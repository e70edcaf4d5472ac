"""Named points where a fault test stops this process as `kill -9` would (issue 64).

A kill at a chosen instant cannot be timed from outside (a supply step's documents and its SBOM
layer are written a second apart), so the fault suite names the point instead:

    TRAINBASE_FAILPOINT=supply.before-sbom-layer python build.py --matrix ...

and the process SIGKILLs itself there: no `finally`, no handler, no report -- exactly what a
runner's OOM kill or a power cut leaves. Unset (always, outside tests/build/test_faults.py), a
point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "TRAINBASE_FAILPOINT"


def hit(name: str) -> None:
    """SIGKILL this process when ``name`` is one of $TRAINBASE_FAILPOINT's comma-separated names."""
    if name in os.environ.get(ENV, "").split(","):
        sys.stderr.write(f"failpoint {name}: SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
