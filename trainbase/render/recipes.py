"""Render every cell's build files from templates/ (Jinja2, StrictUndefined) into images/.

images/<name>/Dockerfile and images/<name>/manifest.json are generated and committed
(docker-library's model): a reviewer sees exactly what each image runs, and `--check`
fails when the committed files drift from what matrix.yaml + templates/ produce.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jinja2

from trainbase_common import safe_io
from trainbase_common.manifest import labels as manifest_labels

from ..define import base_lock, security_rebuilds
from ..define import pip_locks as lockmod
from ..define.invocation import build_py
from ..define.matrix import Cell, Matrix
from ..errors import TemplateError
from . import context as ctxmod

IMAGES_DIR = "images"
TEMPLATES_DIR = "templates"
IMAGEFS_DIR = "imagefs"


@dataclass(frozen=True)
class Rendered:
    cell: Cell
    files: dict[str, str]  # repo-relative path -> content
    recipe: str  # sha256 over everything the build reads: the immutable tag's source
    context: ctxmod.CellContext
    os_stage: str | None = None  # digest of a base cell's first (os/ib) stage: equal digests share its layers

    @property
    def dockerfile(self) -> str:
        return f"{IMAGES_DIR}/{self.cell.name}/Dockerfile"

    @property
    def tag(self) -> str:
        """Immutable tag: a digest of the recipe (Dockerfile, manifest, locks, toolbox,
        patches, and the parent's recipe), so equal inputs give the same tag."""
        return "r" + self.recipe[:12]


def environment(root: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root / TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,  # noqa: S701 -- it renders Dockerfiles and shell, not HTML: escaping would corrupt them
    )


def _apt_names(packages: dict[str, str]) -> Callable[..., str]:
    """apt("ucx-dev", "ucx-utils") in a block: the cell's OS's names for those packages
    (matrix.yaml's distro_packages), space-separated. A block that names a package the table
    has not fails the render, naming the block's line."""

    def apt(*whats: str) -> str:
        missing = [w for w in whats if w not in packages]
        if missing:
            raise KeyError(f"distro_packages has no entry {', '.join(missing)} (matrix.yaml)")
        return " ".join(packages[w] for w in whats)

    return apt


def _template_error(e: Exception, cell: Cell) -> TemplateError:
    if isinstance(e, jinja2.TemplateSyntaxError):
        return TemplateError(f"template {e.name or e.filename} line {e.lineno}: {e.message}", cell=cell.name)
    where = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename.endswith(".j2"):
            where = f"template {Path(frame.filename).relative_to(Path(frame.filename).parents[1]) if 'blocks' in frame.filename else Path(frame.filename).name} line {frame.lineno}: "
            break
    if isinstance(e, jinja2.TemplateNotFound):
        return TemplateError(f"{where}template not found: {e.name}", cell=cell.name)
    return TemplateError(f"{where}{type(e).__name__}: {e}", cell=cell.name)


# Python's bytecode caches appear wherever the in-image tools run on the host (unit tests):
# never part of a recipe, never sent to the engine (.dockerignore says the same).
_BYTECODE = re.compile(r"(^|/)__pycache__/|\.pyc$")


def _file_digest(root: Path, rel: str) -> str:
    p = root / rel
    if p.is_dir():
        parts = [
            f"{f.relative_to(root)}:{f.stat().st_mode & 0o111:o}:{hashlib.sha256(f.read_bytes()).hexdigest()}"
            for f in sorted(p.rglob("*"))
            if f.is_file() and not _BYTECODE.search(str(f))
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "missing"


def render_all(m: Matrix, cells: list[Cell] | None = None, root: Path | None = None) -> dict[str, Rendered]:
    """Render the given cells (default: every included cell) plus the parents they need."""
    root = root or m.path.parent
    env = environment(root)
    wanted = cells if cells is not None else m.included
    bases = base_lock.load(root)
    rebuilds = security_rebuilds.load(root)
    out: dict[str, Rendered] = {}

    def render(cell: Cell) -> Rendered:
        if cell.name in out:
            return out[cell.name]
        parent = render(m.cell(cell.parent)) if cell.parent else None
        cc = ctxmod.build(m, cell)
        base = base_lock.entry_for(bases, cc.data["os"]["base_key"], cc.data["os"]["bootstrappable"])
        build_base_key = cc.data["os"]["build_base_key"]
        build_base = base_lock.entry_for(bases, build_base_key, False) if build_base_key else None
        manifest_text = json.dumps(cc.manifest, indent=2, sort_keys=True) + "\n"
        data = dict(
            cc.data,
            labels=manifest_labels(cc.manifest),
            namespace=m.spec.naming.namespace,
            parent_tag=parent.tag if parent else None,
            base_from=base.from_ref(),
            build_base_from=build_base.from_ref() if build_base else None,
            security_rebuild=security_rebuilds.epoch(rebuilds, cell.os),
            apt=_apt_names(cc.data["packages"]),
        )
        try:
            text = env.get_template("Dockerfile.j2").render(**data)
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError) as e:
            raise _template_error(e, cell) from None
        text = _tidy(text)
        files = {f"{IMAGES_DIR}/{cell.name}/Dockerfile": text, f"{IMAGES_DIR}/{cell.name}/manifest.json": manifest_text}
        h = hashlib.sha256()
        for path in sorted(files):
            h.update(f"{path}\n{hashlib.sha256(files[path].encode()).hexdigest()}\n".encode())
        inputs = [ls.path for ls in cc.locks] + ([IMAGEFS_DIR] if not cell.parent else [])
        if cell.release and cell.release.patch:
            inputs.append(cell.release.patch.file)
        for rel in sorted(inputs):
            h.update(f"{rel}\n{_file_digest(root, rel)}\n".encode())
        if parent:
            h.update(f"parent {parent.recipe}\n".encode())
        else:
            # the base's locked identity: one tag, one base (a child follows through its parent)
            h.update(base.recipe_line().encode())
            if build_base:  # the compile stages' base: what UCX and Open MPI were built with
                h.update(("build " + build_base.recipe_line()).encode())
        os_stage = None
        if not cell.parent:
            stage = env.get_template("os-stage.Dockerfile.j2").render(**data)
            # one platform's layers serve only that platform's cells
            os_stage = hashlib.sha256((cell.platform + "\n" + stage).encode()).hexdigest()
        r = Rendered(cell=cell, files=files, recipe=h.hexdigest(), context=cc, os_stage=os_stage)
        out[cell.name] = r
        return r

    for c in wanted:
        render(c)
    return out


def _tidy(text: str) -> str:
    """Collapse runs of blank lines left by template control blocks; end with one newline."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    tidy: list[str] = []
    for ln in lines:
        if ln == "" and (not tidy or tidy[-1] == ""):
            continue
        tidy.append(ln)
    while tidy and tidy[-1] == "":
        tidy.pop()
    return "\n".join(tidy) + "\n"


def write(rendered: dict[str, Rendered], root: Path, prune: bool = True) -> tuple[list[str], list[str]]:
    """Write the files; remove images/<dir> that no cell renders any more. Returns
    (changed cell names, removed dir names)."""
    changed = []
    for r in rendered.values():
        dirty = False
        for rel, content in r.files.items():
            p = root / rel
            if not p.exists() or p.read_text() != content:
                p.parent.mkdir(parents=True, exist_ok=True)
                safe_io.atomic_write(p, content)  # a full disk leaves the old file, not half a new one
                dirty = True
        if dirty:
            changed.append(r.cell.name)
    removed = []
    if prune:
        keep = {r.cell.name for r in rendered.values()}
        for d in sorted((root / IMAGES_DIR).glob("*/")) if (root / IMAGES_DIR).exists() else []:
            if d.is_dir() and d.name not in keep:
                for f in sorted(d.rglob("*"), reverse=True):
                    f.unlink() if f.is_file() else f.rmdir()
                d.rmdir()
                removed.append(d.name)
    return sorted(changed), removed


def check(m: Matrix, rendered: dict[str, Rendered], root: Path, orphans: bool = True) -> list[str]:
    """Drift between the committed images/ (and locks/) and a fresh render: one line per problem.
    orphans=False checks only the rendered cells (a build checks just what it builds)."""
    problems = []
    for r in sorted(rendered.values(), key=lambda r: r.cell.name):
        for rel, content in r.files.items():
            p = root / rel
            if not p.exists():
                problems.append(f"{r.cell.name}: {rel} is missing")
            elif p.read_text() != content:
                problems.append(f"{r.cell.name}: {rel} differs from what the templates render")
    keep = {r.cell.name for r in rendered.values()}
    if orphans and (root / IMAGES_DIR).exists():
        for d in sorted((root / IMAGES_DIR).iterdir()):
            if d.is_dir() and d.name not in keep:
                why = ""
                if d.name in m.by_name() and m.cell(d.name).excluded:
                    why = f" (excluded: {m.cell(d.name).excluded})"
                problems.append(f"{d.name}: images/{d.name} belongs to no cell{why}")
    for ls in lock_sets(rendered):
        st = lockmod.status(root, ls)
        if st:
            problems.append(f"lock: {st}")
    if orphans and (root / lockmod.LOCK_DIR).exists():
        problems += [
            f"lock: locks/{p.name} belongs to no cell (run `{build_py()} lock`, which removes it)"
            for p in lockmod.orphans(root, lock_sets(rendered))
        ]
    return problems


def lock_sets(rendered: dict[str, Rendered]) -> list[lockmod.LockSet]:
    seen: dict[str, lockmod.LockSet] = {}
    for r in rendered.values():
        for ls in r.context.locks:
            seen.setdefault(ls.name, ls)
    return [seen[k] for k in sorted(seen)]


def missing_locks(rendered: dict[str, Rendered], root: Path) -> list[str]:
    return [st for ls in lock_sets(rendered) if (st := lockmod.status(root, ls))]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use build.py")
