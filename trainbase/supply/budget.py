"""A built image against its size budget (the manifest's `size_budget_gb`, from matrix.yaml) and
against the bytes its layers waste: the verdict and, for a cell over either, the text that says
where the bytes are -- largest layers, largest directories, largest wasted files -- so that the
fix can start from the report instead of a `docker history` session. Reporting only: nothing
here runs docker; the build gathers the inputs (engine.image_history, LARGEST_DIRS_COMMAND in a
throwaway container of the image, trainbase_common.layers.layer_waste) and passes them in."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from trainbase_common.layers import Waste, WastedFile, instruction, waste_share

# Run with `sh -c` in a container of the image. -x: the image's own filesystem only (not /proc,
# /sys, /dev or bind mounts); -b: apparent bytes, as the layers count them. Depth 6 reaches the
# directories that explain a training image (/usr/local/lib/python3.12/dist-packages/torch);
# 400 lines, largest first, hold every directory down to the sizes a top ten can show; sed, not
# head, so sort never dies of SIGPIPE if the shell that runs this has pipefail.
LARGEST_DIRS_COMMAND = "du -x -b --max-depth=6 / 2>/dev/null | sort -rn | sed -n 1,400p"  # sed reads to the end: no SIGPIPE (pipefail_lint)

WASTE_BUDGET_SHARE = 0.03  # the bytes no container sees may be 3% of the image at most
LARGEST_LAYERS = 5
LARGEST_DIRS = 10
TOP_WASTE = 10


def fmt_size(n: int) -> str:
    """Decimal GB with 2 decimals, as the build summary and `docker images` show sizes; below
    10 MB (which would read 0.00 GB) in MB with 1 decimal."""
    return f"{n / 1e9:.2f} GB" if n >= 10_000_000 else f"{n / 1e6:.1f} MB"


def largest_dirs(du_output: str, n: int = LARGEST_DIRS) -> list[tuple[str, int]]:
    """The N directories of `du` output (SIZE<tab>PATH lines) that say where the bytes are.

    du lists every directory with the bytes of everything below it, so a plain top list is /,
    /usr, /usr/local, ... each containing the next. The rule instead: at a threshold T, show
    each directory of at least T bytes none of whose subdirectories has T bytes -- the deepest
    directories of that size. No two of them contain each other (a directory of T bytes below
    one of them would disqualify it), so no byte is counted twice. T is the largest size at
    which there are N such directories; lowering T only splits a directory into its large
    subdirectories or adds new ones, never fewer. Largest first."""
    sizes: dict[str, int] = {}
    for line in du_output.splitlines():
        size_text, sep, path = line.partition("\t")
        if not sep:
            size_text, _, path = line.strip().partition(" ")
        try:
            sizes[path.strip()] = int(size_text)
        except ValueError:
            continue  # du's complaints that reached stdout
    largest_child: dict[str, int] = {}
    for path, size in sizes.items():
        parent = posixpath.dirname(path)
        if parent != path:  # "/" is its own dirname
            largest_child[parent] = max(largest_child.get(parent, 0), size)

    def deepest(threshold: int) -> list[tuple[str, int]]:
        return [(p, s) for p, s in sizes.items() if s >= threshold and largest_child.get(p, 0) < threshold]

    chosen: list[tuple[str, int]] = []
    for threshold in sorted(set(sizes.values()), reverse=True):
        chosen = deepest(threshold)
        if len(chosen) >= n:
            break
    return sorted(chosen, key=lambda ps: (-ps[1], ps[0]))[:n]


@dataclass
class BudgetVerdict:
    cell: str
    size_bytes: int
    budget_gb: float
    over_size: bool
    waste_bytes: int
    waste_share: float
    waste_budget_share: float
    over_waste: bool
    waste_measured: bool  # False: the layers were not scanned, nothing is known of their waste
    largest_layers: list[tuple[int, str]] = field(default_factory=list)  # (bytes, instruction)
    largest_dirs: list[tuple[str, int]] = field(default_factory=list)
    wasted_files: list[WastedFile] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.over_size or self.over_waste)

    def message(self) -> str:
        size, budget = fmt_size(self.size_bytes), f"{float(self.budget_gb)!r} GB"
        waste = f"{fmt_size(self.waste_bytes)} ({self.waste_share:.1%})"
        if self.ok:
            return f"cell {self.cell} is {size}, within its budget of {budget}" + (
                f"; its layers waste {waste}" if self.waste_measured else ""
            )
        lines = []
        if self.over_size:
            lines.append(f"cell {self.cell} is {size}, over its budget of {budget} (matrix.yaml size_budget_gb)")
            lines.append("  largest layers:")
            lines += [f"    {fmt_size(n):>9}  {cmd}" for n, cmd in self.largest_layers]
            lines.append("  largest directories:")
            lines += [f"    {fmt_size(n):>9}  {path}" for path, n in self.largest_dirs]
            if self.waste_measured and not self.over_waste:
                lines.append(f"  its layers waste {waste}, within the {self.waste_budget_share:.0%} allowed")
        if self.over_waste:
            lines.append(
                f"cell {self.cell} wastes {waste} of its {size}, over the {self.waste_budget_share:.0%} "
                "allowed: bytes a later layer deletes or overwrites still ship in the layer that wrote them"
            )
            lines.append("  largest wasted files:")
            lines += [
                f"    {fmt_size(w.size):>9}  /{w.path} written in {w.written_in}; {w.how} in {w.removed_in}"
                for w in self.wasted_files
            ]
        return "\n".join(lines)


def check_budget(
    cell: str,
    size_bytes: int,
    budget_gb: float,
    layers: list[dict[str, Any]],
    largest_dirs: list[tuple[str, int]],
    waste: Waste | None,
    waste_budget_share: float = WASTE_BUDGET_SHARE,
) -> BudgetVerdict:
    """The verdict on one built cell. LAYERS: the image history ({"created_by", "size"}), any
    order; LARGEST_DIRS: largest_dirs() of LARGEST_DIRS_COMMAND's output; WASTE: layer_waste()
    of the image's layers, or None when they were not scanned (no waste verdict then)."""
    share = waste_share(waste, size_bytes) if waste else 0.0
    biggest = sorted((ly for ly in layers if int(ly.get("size") or 0) > 0), key=lambda ly: -int(ly["size"]))
    return BudgetVerdict(
        cell=cell,
        size_bytes=size_bytes,
        budget_gb=budget_gb,
        over_size=size_bytes > budget_gb * 1e9,  # decimal GB, as the conformance check compares
        waste_bytes=waste.total if waste else 0,
        waste_share=share,
        waste_budget_share=waste_budget_share,
        over_waste=share > waste_budget_share,
        waste_measured=waste is not None,
        largest_layers=[
            (int(ly["size"]), instruction(str(ly.get("created_by") or ""), 80)) for ly in biggest[:LARGEST_LAYERS]
        ],
        largest_dirs=list(largest_dirs[:LARGEST_DIRS]),
        wasted_files=list(waste.top[:TOP_WASTE]) if waste else [],
    )
