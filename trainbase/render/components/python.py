"""Python: a venv over the distro's interpreter, or Miniforge's conda (a pinned installer), with
the project's own pip set (mpi4py and the suite's needs)."""

from __future__ import annotations

from .facts import Block, Facts


def block(f: Facts) -> Block:
    lock = f.lock(f"python-{f.python_tag}", f.spec.python.packages)
    installer = f.osr.python.installer
    return Block(
        {
            "manager": f.osr.python.manager,
            "version": f.py,
            "prefix": f.python_prefix,
            "installer": f.artifact(installer),
            "lock": lock.path,
        },
        locks=(lock,),
        artifacts=(installer,) if installer else (),
    )
