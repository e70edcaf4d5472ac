"""Which cells a change affects: `build.py --affected REV` and `--ci-matrix --since REV`.

A cell must be rebuilt exactly when its immutable tag changes: the tag is the hash of
everything its build reads (Dockerfile, manifest, locks, toolbox, patches, and the parent's
recipe; render/recipes.py), so comparing each cell's tag at the base revision with the tag the
working tree renders is exact for every input a person edits -- matrix.yaml, templates/,
imagefs/, locks/, patches/ -- and a framework cell follows its parent for free. Mapping
files to cells by hand would have to know which block each template serves; the hash does
not have to.

Changed paths are sorted into what they can affect:
- recipe: decided by the tag comparison above (images/<cell>/ also names that cell and the
  cells built on it directly, so a hand edit there is tested even though --check rejects it);
- suite: the conformance suite and what it runs (examples/): every cell is re-tested, none
  is rebuilt (their tags do not change, so the published images are what gets tested);
- tool: the build tool itself (trainbase/, build.py, requirements, scripts): no image's tag
  changes; the unit tests and the end-to-end local-profile job exercise it;
- none: documentation, workflows, unit tests, benchmarks.
A path matching no rule is counted as `tool` and listed, so nothing is silently ignored.
"""

from __future__ import annotations

import fnmatch
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..define.matrix import Matrix, load
from ..errors import TrainbaseError
from ..render import recipes as rendermod

# What `render_all` reads besides matrix.yaml: exported from the base revision to render it.
RECIPE_INPUTS = ("matrix.yaml", rendermod.TEMPLATES_DIR, rendermod.IMAGEFS_DIR, "locks", "patches")

# First match wins; patterns are fnmatch patterns over repository-relative paths.
PATH_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("recipe", ("matrix.yaml", "templates/*", "imagefs/*", "locks/*", "patches/*", "images/*")),
    # prose beside the suite (its checks' README, the examples' README) changes no check; what the
    # images carry was matched above
    ("none", ("*.md",)),
    ("suite", ("tests/conformance/*", "trainbase_conformance/*", "packaging/conformance/*", "examples/*")),
    ("none", ("docs/*", "*.md", ".github/*", "tests/unit/*", "bench/*", ".gitignore", "LICENSE")),
    (
        "tool",
        (
            "trainbase/*",
            "trainbase_common/*",
            "build.py",
            "requirements*.txt",
            "pyproject.toml",
            "scripts/*",
            ".ci/*",
            "tests/build/*",
            "tests/conftest.py",
            ".dockerignore",
            ".hadolint.yaml",
        ),
    ),
)
KINDS = ("recipe", "suite", "tool", "none")


def classify(path: str) -> str:
    for kind, patterns in PATH_KINDS:
        if any(fnmatch.fnmatchcase(path, p) for p in patterns):
            return kind
    return "tool"  # unknown: the conservative answer, and it is listed


@dataclass
class Affected:
    build: dict[str, str] = field(default_factory=dict)  # cell -> why it must be rebuilt
    test: dict[str, str] = field(default_factory=dict)  # cell -> why its conformance must run
    removed: list[str] = field(default_factory=list)  # cells the base had and the change drops
    paths: dict[str, list[str]] = field(default_factory=dict)  # kind -> changed paths

    def as_json(self) -> dict[str, Any]:
        return {
            "build": self.build,
            "test": self.test,
            "removed": self.removed,
            "paths": {k: self.paths.get(k, []) for k in KINDS},
        }


def compare(
    head: Matrix,
    head_tags: dict[str, str],
    base_tags: dict[str, str] | None,
    changed: list[str],
    base_problem: str = "",
) -> Affected:
    """The cells ``changed`` paths affect, from each cell's tag at the base (``base_tags``;
    None when the base revision could not be rendered, ``base_problem`` saying why: then
    every cell is rebuilt) and at the head. Cells are returned in matrix order."""
    out = Affected()
    for p in changed:
        out.paths.setdefault(classify(p), []).append(p)
    included = [c for c in head.included if c.name in head_tags]
    edited_dirs = {
        p.split("/")[1] for p in out.paths.get("recipe", []) if p.startswith("images/") and p.count("/") >= 2
    }
    for c in included:
        new = head_tags[c.name]
        if base_tags is None:
            why = f"the base revision could not be rendered ({base_problem})"
        elif c.name not in base_tags:
            why = "new cell"
        elif base_tags[c.name] != new:
            parent_rebuilt = c.parent in out.build
            why = (
                f"its parent {c.parent} is rebuilt"
                if parent_rebuilt
                else f"recipe changed ({base_tags[c.name]} -> {new})"
            )
        elif c.name in edited_dirs or c.parent in out.build:
            why = "its images/ files were edited" if c.name in edited_dirs else f"its parent {c.parent} is rebuilt"
        else:
            continue
        out.build[c.name] = why
    suite = out.paths.get("suite", [])
    for c in included:
        if c.name in out.build:
            out.test[c.name] = out.build[c.name]
        elif suite:
            out.test[c.name] = f"the conformance suite changed ({suite[0]}{' ...' if len(suite) > 1 else ''})"
    out.removed = sorted(set(base_tags or {}) - set(head_tags))
    return out


# -- git plumbing ---------------------------------------------------------------------------------
def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TrainbaseError(f"git {' '.join(args)}: {(proc.stderr or proc.stdout).strip()[:300]}")
    return proc.stdout


def merge_base(root: Path, rev: str) -> str:
    """Where this branch left REV (a pull request's diff is against that, not REV's tip)."""
    return _git(root, "merge-base", rev, "HEAD").strip()


def changed_paths(root: Path, base: str) -> list[str]:
    """Paths the working tree (committed or not, and untracked files) changes since ``base``."""
    tracked = _git(root, "diff", "--name-only", base, "--").splitlines()
    untracked = _git(root, "ls-files", "--others", "--exclude-standard").splitlines()
    return sorted(set(tracked) | set(untracked))


def tags_at(root: Path, rev: str) -> dict[str, str]:
    """Each included cell's immutable tag as revision ``rev`` renders it (with this code):
    the recipe inputs are exported from git into a scratch folder and rendered there.
    Raises TrainbaseError when that revision's matrix cannot be read."""
    present = set(_git(root, "ls-tree", "--name-only", rev).split())
    inputs = [p for p in RECIPE_INPUTS if p in present]
    if "matrix.yaml" not in inputs:
        raise TrainbaseError(f"{rev} has no matrix.yaml")
    with tempfile.TemporaryDirectory(prefix="trainbase-base-") as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", rev, "--", *inputs], cwd=root, capture_output=True, check=False
        )
        if archive.returncode != 0:
            raise TrainbaseError(f"git archive {rev}: {archive.stderr.decode(errors='replace').strip()[:300]}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        base = load(Path(tmp) / "matrix.yaml")
        return {name: r.tag for name, r in rendermod.render_all(base, root=Path(tmp)).items()}


def since(m: Matrix, root: Path, rev: str) -> Affected:
    """What the working tree changes relative to where it left ``rev`` (e.g. origin/main)."""
    base = merge_base(root, rev)
    head_tags = {name: r.tag for name, r in rendermod.render_all(m, root=root).items()}
    try:
        base_tags, problem = tags_at(root, base), ""
    except TrainbaseError as e:  # e.g. this code's schema cannot read the old matrix.yaml
        base_tags, problem = None, str(e)
    return compare(m, head_tags, base_tags, changed_paths(root, base), problem)


def describe(a: Affected) -> str:
    """The text `build.py --affected` prints: cells to rebuild, cells to re-test, and why."""
    lines = [f"rebuild {len(a.build)} cell(s):"] + [f"  {n}  ({why})" for n, why in a.build.items()]
    only_test = {n: why for n, why in a.test.items() if n not in a.build}
    lines += [f"re-test {len(only_test)} more cell(s) (no rebuild):"]
    lines += [f"  {n}  ({why})" for n, why in only_test.items()]
    if a.removed:
        lines += [f"no longer in the matrix ({len(a.removed)}; their tags stay published): " + ", ".join(a.removed)]
    for kind in KINDS:
        if a.paths.get(kind):
            lines.append(f"changed {kind} paths: " + ", ".join(a.paths[kind]))
    return "\n".join(lines)
