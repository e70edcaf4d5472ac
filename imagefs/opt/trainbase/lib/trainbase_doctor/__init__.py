"""trainbase doctor: the image's own preflight, run where the hardware is.

    tb-doctor                      # this node: one line per check (ok / warn / fail / skip + fix)
    tb-doctor --json               # the same, machine-readable (schema: docs/doctor.schema.json)
    mpirun ... tb-doctor --cluster [--allreduce]   # every rank checks; rank 0 prints node x check

Checks register themselves in core.CHECKS; the conformance suite runs the same checks through
this tool, so a check is written once. Standard library only (mpi4py/torch only for --cluster
and --allreduce, from the image)."""

# The checks run and report in the order they register, which is this import order (node, then
# fabric, stack, GPUDirect): isort must not sort it.
# isort: off
from . import checks_node, checks_fabric, checks_stack, checks_gpudirect  # noqa: F401 -- registers the checks

# isort: on
from .core import CHECKS, Node, Result, run_checks, select

__all__ = ["CHECKS", "Node", "Result", "run_checks", "select"]
SCHEMA_VERSION = 1
