"""Figures in the docs' prose, computed from the matrix (issue 65).

A count typed into README.md goes stale the day a version is added or dropped, and nothing says
so. So each one stands between two markers the render rewrites and `check` compares, like
docker-library's generated files:

    Today's matrix: <!--fig:cells-->193<!--/fig--> cells ...

The markers are HTML comments: GitHub's renderer shows only the number. A figure's name is one of
FIGURES below; a name that is not one is an error naming the file and line, so a typo cannot
leave a number unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from trainbase_common import safe_io

from ..define.matrix import Cell, Matrix

# the files whose prose carries figures (relative to the checkout); others never have any
DOCS = ("README.md", "docs")
MARK = re.compile(r"<!--fig:(?P<name>[\w.-]+)-->(?P<value>[^<\n]*)<!--/fig-->")


def _with_parents(m: Matrix, cells: list[Cell]) -> list[Cell]:
    """The images a build of ``cells`` makes: each cell and every parent it is built FROM."""
    by_name, seen = m.by_name(), {c.name: c for c in cells}
    todo = list(cells)
    while todo:
        parent = todo.pop().parent
        if parent and parent not in seen:
            seen[parent] = by_name[parent]
            todo.append(seen[parent])
    return list(seen.values())


def _on(cells: list[Cell], platform: str | None = None, os_family: str | None = None) -> int:
    return sum(
        1
        for c in cells
        if (platform is None or c.platform == platform) and (os_family is None or c.os.startswith(os_family))
    )


def _profile(m: Matrix, name: str) -> list[Cell]:
    return [c for c in m.included if name in c.profiles]


def figures(m: Matrix) -> dict[str, Callable[[], int]]:
    """Every figure a doc may name, lazily (a page names a few)."""
    inc = m.included
    amd64, arm64 = "linux/amd64", "linux/arm64"
    prod = _profile(m, "production")
    out: dict[str, Callable[[], int]] = {
        "cells": lambda: len(inc),
        "excluded": lambda: len(m.cells) - len(inc),
        "cells.amd64": lambda: _on(inc, amd64),
        "cells.arm64": lambda: _on(inc, arm64),
        "cells.amd64.debian": lambda: _on(inc, amd64, "debian"),
        "cells.arm64.debian": lambda: _on(inc, arm64, "debian"),
        "production.amd64": lambda: _on(prod, amd64),
        "production.arm64": lambda: _on(prod, arm64),
    }
    for name in m.spec.profiles:
        out[f"profile.{name}.cells"] = lambda name=name: len(_profile(m, name))  # type: ignore[misc]
        out[f"profile.{name}.images"] = lambda name=name: len(_with_parents(m, _profile(m, name)))  # type: ignore[misc]
        out[f"profile.{name}.cells.amd64"] = lambda name=name: _on(_profile(m, name), amd64)  # type: ignore[misc]
        out[f"profile.{name}.images.amd64"] = lambda name=name: _on(  # type: ignore[misc]
            _with_parents(m, _profile(m, name)), amd64
        )
        out[f"profile.{name}.cells.arm64"] = lambda name=name: _on(_profile(m, name), arm64)  # type: ignore[misc]
        out[f"profile.{name}.images.arm64"] = lambda name=name: _on(  # type: ignore[misc]
            _with_parents(m, _profile(m, name)), arm64
        )
    return out


def doc_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for entry in DOCS:
        p = root / entry
        found += sorted(p.rglob("*.md")) if p.is_dir() else [p] if p.is_file() else []
    return found


def _rewrite(m: Matrix, root: Path, path: Path) -> tuple[str, list[str]]:
    """The file's text with every figure recomputed, and one line per problem (stale or unknown)."""
    table = figures(m)
    text = path.read_text()
    problems: list[str] = []
    rel = path.relative_to(root)

    def one(match: re.Match[str]) -> str:
        name, said = match["name"], match["value"]
        line = text.count("\n", 0, match.start()) + 1
        if name not in table:
            problems.append(f"figures: {rel}:{line}: no figure named {name!r} (known: {', '.join(sorted(table))})")
            return match[0]
        now = str(table[name]())
        if said.strip() != now:
            problems.append(
                f"figures: {rel}:{line}: figure {name} says {said.strip() or '(nothing)'}, the matrix has {now}"
            )
        return f"<!--fig:{name}-->{now}<!--/fig-->"

    return MARK.sub(one, text), problems


def check(m: Matrix, root: Path) -> list[str]:
    """What `build.py check` reports: every figure that differs from the matrix (the render fixes
    those), every marker naming no figure."""
    return [p for path in doc_files(root) for p in _rewrite(m, root, path)[1]]


def write(m: Matrix, root: Path) -> tuple[list[str], list[str]]:
    """Rewrite every figure in the docs; (the files that changed, the unknown figure names)."""
    changed, unknown = [], []
    for path in doc_files(root):
        text, problems = _rewrite(m, root, path)
        unknown += [p for p in problems if "no figure named" in p]
        if text != path.read_text():
            safe_io.atomic_write(path, text)
            changed.append(str(path.relative_to(root)))
    return changed, unknown
