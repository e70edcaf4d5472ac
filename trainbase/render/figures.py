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
DOCS = ("README.md", "docs", "examples", "packaging", "trainbase_conformance/checks")
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


# A generated block: a whole fenced example between markers (outside the fence, so GitHub shows
# only the fence), rewritten by the render. Its name is one of BLOCKS.
BLOCK = re.compile(r"<!--block:(?P<name>[\w.-]+)-->\n(?P<body>.*?)<!--/block-->", re.S)


def excluded_example(m: Matrix) -> tuple[str, str]:
    """An excluded cell to show `explain` on, and why it is excluded: a PyTorch release on a CUDA
    of the axis that no release is built for (the instructive case), on the first platform's
    Debian row when there is one; else the first excluded framework cell. Chosen from the matrix,
    so an example never names a version the matrix dropped."""
    first = m.spec.axes.platform[0]
    names = sorted(m.spec.frameworks, key=lambda n: n != "pytorch")
    for fw in names:
        releases = m.spec.frameworks[fw].releases
        if not releases:
            continue
        for cuda in m.spec.axes.cuda:
            if any(cuda in r.cuda for r in releases):
                continue
            bases = [c for c in m.included if c.framework == "none" and c.cuda == cuda and c.platform == first]
            bases.sort(key=lambda c: not c.os.startswith("debian"))
            for base in bases:
                # the framework's cell on that base: excluded, named without a version (no release)
                axes = {k: v for k, v in base.axes.items() if k != "framework"}
                found = next(
                    (
                        c
                        for c in m.cells
                        if c.framework == fw and c.excluded and {k: c.axes.get(k) for k in axes} == axes
                    ),
                    None,
                )
                if found is not None:
                    return f"{fw}{releases[0].version}-{base.name}", found.excluded or ""
    c = next(c for c in m.cells if c.excluded and c.framework != "none" and c.platform == first)
    return c.name, c.excluded or ""


def _explain_block(m: Matrix) -> str:
    asked, why = excluded_example(m)
    why = " ".join(why.split())
    return f"```sh\n.venv/bin/python build.py explain {asked}\n#   ... EXCLUDED ... because {why}\n```\n"


BLOCKS: dict[str, Callable[[Matrix], str]] = {"explain-excluded": _explain_block}


def as_read(text: str) -> str:
    """The text as a reader sees it: each figure's value without its markers."""
    return MARK.sub(lambda m: m["value"], text)


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

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        line = text.count("\n", 0, match.start()) + 1
        if name not in BLOCKS:
            problems.append(f"figures: {rel}:{line}: no generated block named {name!r} (known: {', '.join(BLOCKS)})")
            return match[0]
        now = BLOCKS[name](m)
        if match["body"] != now:
            first = (match["body"].splitlines() or ["(empty)"])[min(1, len(match["body"].splitlines()) - 1)]
            problems.append(f"figures: {rel}:{line}: the generated block {name} is stale ({first.strip()[:100]})")
        return f"<!--block:{name}-->\n{now}<!--/block-->"

    return BLOCK.sub(block, MARK.sub(one, text)), problems


def check(m: Matrix, root: Path) -> list[str]:
    """What `build.py check` reports: every figure that differs from the matrix (the render fixes
    those), every marker naming no figure."""
    return [p for path in doc_files(root) for p in _rewrite(m, root, path)[1]]


def write(m: Matrix, root: Path) -> tuple[list[str], list[str]]:
    """Rewrite every figure in the docs; (the files that changed, the unknown figure names)."""
    changed, unknown = [], []
    for path in doc_files(root):
        text, problems = _rewrite(m, root, path)
        unknown += [p for p in problems if "no figure named" in p or "no generated block named" in p]
        if text != path.read_text():
            safe_io.atomic_write(path, text)
            changed.append(str(path.relative_to(root)))
    return changed, unknown
