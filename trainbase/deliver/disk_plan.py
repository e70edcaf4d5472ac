"""What one CI cell job holds on its runner's disk at once, from the size budgets in
matrix.yaml (an image over its budget fails the build's supply gate, so the budgets bound it):

- ``image_gb``: the cell's image, its budget. A framework image's budget includes its parent's
  layers, which the job pulls first: the parent is held once, inside this figure;
- ``build_gb``: what the build holds besides the finished layers -- BuildKit's snapshots of the
  step being built and the downloads it extracts (wheels, installers): at most the cell's own
  increment (its budget less its parent's; a base cell's whole budget);
- ``save_gb``: the waste audit reads the image as a `docker save` stream (trainbase reads it as
  it comes and writes nothing), but the engine first stages the whole tar under its data root:
  the image's size again. It is the largest transient and it is counted, not assumed away;
- ``margin_gb``: logs, reports, the suite's scratch containers.

The total must fit the platform's ``runner_disk_gb`` (matrix.yaml): a unit test checks every
cell the ci-matrix emits, and the build step passes the total as ``--min-free-gb`` so a runner
with less room fails before building, naming the figure (never an hour in with ENOSPC).
"""

from __future__ import annotations

from ..define.matrix import Cell, Matrix
from ..render.recipes import Rendered

MARGIN_GB = 2.0


def budget(rendered: dict[str, Rendered], name: str) -> float:
    return float(rendered[name].context.manifest["size_budget_gb"])


def plan(m: Matrix, rendered: dict[str, Rendered], cell: Cell) -> dict[str, float]:
    image = budget(rendered, cell.name)
    own = image - (budget(rendered, cell.parent) if cell.parent else 0.0)
    d = {"image_gb": image, "build_gb": round(own, 2), "save_gb": image, "margin_gb": MARGIN_GB}
    d["total_gb"] = round(sum(d.values()), 1)
    d["runner_disk_gb"] = m.spec.platforms[cell.platform].runner_disk_gb
    return d
