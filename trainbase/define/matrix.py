"""Load matrix.yaml, check it, and expand it into cells (included or excluded, with reasons)."""

from __future__ import annotations

import hashlib
import itertools
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.utils import canonicalize_name
from pydantic import ValidationError

from trainbase_common import safe_io

from ..errors import MatrixError
from .schema import AXES, MatrixFile, Release

# matrix.yaml's component table for each axis (the axis name where they are the same)
TABLE_NAMES = {"framework": "frameworks", "platform": "platforms"}


@dataclass(frozen=True)
class Cell:
    """One image of the matrix: one value per axis, resolved against the component tables."""

    platform: str
    os: str
    cuda: str
    mpi: str
    ib: str
    framework: str
    name: str  # the cell's own name: unique, carries the platform tag
    release: Release | None = None  # the framework release (None for framework=none)
    parent: str | None = None  # name of the cell this image is built FROM
    excluded: str | None = None  # reason, when the cell does not exist
    profiles: tuple[str, ...] = ()

    @property
    def axes(self) -> dict[str, str]:
        return {a: getattr(self, a) for a in AXES}

    image: str = ""  # the published repository: the same for every platform

    @property
    def framework_version(self) -> str | None:
        return self.release.version if self.release else None

    @property
    def arch(self) -> str:
        """linux/arm64 -> arm64"""
        return self.platform.rsplit("/", 1)[-1]


@dataclass
class Matrix:
    spec: MatrixFile
    path: Path
    cells: list[Cell] = field(default_factory=list)  # every combination, in axis order

    @property
    def included(self) -> list[Cell]:
        return [c for c in self.cells if not c.excluded]

    def by_name(self) -> dict[str, Cell]:
        return {c.name: c for c in self.cells}

    def cell(self, name: str) -> Cell:
        try:
            return self.by_name()[name]
        except KeyError:
            raise MatrixError(f"no cell named {name!r} in {self.path.name} (see `build.py list`)") from None

    def leftovers(self) -> list[str]:
        """What still names a version the axes no longer have (issue 65: a dropped CUDA
        version's table, a release still listing it, a hold on it) -- harmless to the cells,
        but a trap for the next person, who reads it as current. One line per reference."""
        s, out = self.spec, []
        tables: dict[str, Mapping[str, object]] = {
            "platform": s.platforms,
            "os": s.os,
            "cuda": s.cuda,
            "mpi": s.mpi,
            "ib": s.ib,
        }
        for axis, table in tables.items():
            on_axis = getattr(s.axes, axis)
            name = TABLE_NAMES.get(axis, axis)
            out += [f"{name}.{k}: no value of axes.{axis} uses it; delete the table" for k in table if k not in on_axis]
        for fw, table_fw in s.frameworks.items():
            for r in table_fw.releases:
                for c in r.cuda:
                    if c not in s.axes.cuda:
                        out.append(
                            f"frameworks.{fw}.releases[version={r.version}].cuda: lists CUDA {c}, which "
                            "axes.cuda no longer has; take it out of the list"
                        )
        for i, h in enumerate(s.holds):
            if h.where and (m := re.match(r"cuda\.(\d+\.\d+)", h.where)) and m.group(1) not in s.axes.cuda:
                out.append(f"holds[{i}] (where: {h.where}): holds a CUDA row axes.cuda no longer has; delete the hold")
        return out

    # -- selection -----------------------------------------------------------------------
    def select(self, filters: dict[str, list[str]] | None = None, profile: str | None = None) -> list[Cell]:
        """Included cells matching every KEY=VALUE filter and the profile. Empty is an error."""
        cells = self.included
        if profile is not None:
            if profile not in self.spec.profiles:
                raise MatrixError(f"unknown profile {profile!r} (profiles: {', '.join(self.spec.profiles) or 'none'})")
            cells = [c for c in cells if profile in c.profiles]
        for key, values in (filters or {}).items():
            if key not in AXES and key != "name":
                raise MatrixError(f"--select {key}=...: unknown key (use one of: {', '.join(AXES)}, name)")
            if key != "name":
                declared = getattr(self.spec.axes, key)
                for v in values:
                    if v not in declared:
                        raise MatrixError(f"--select {key}={v}: unknown value (declared: {', '.join(declared)})")
            cells = [c for c in cells if (c.name if key == "name" else getattr(c, key)) in values]
        if not cells:
            what = ", ".join(f"{k}={'|'.join(v)}" for k, v in (filters or {}).items())
            raise MatrixError(
                f"the selection matches no cell ({what or 'no filters'}{', profile ' + profile if profile else ''})"
            )
        return cells


def load(path: str | Path = "matrix.yaml") -> Matrix:
    path = Path(path)
    try:
        raw = yaml.load(safe_io.read_text(path), Loader=safe_io.UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except FileNotFoundError:
        raise MatrixError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise MatrixError(f"{path}: a directory, not a matrix file") from None
    except safe_io.InputError as e:
        raise MatrixError(str(e).replace(str(path), path.name, 1)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise MatrixError(f"{path.name}:{where}: malformed YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise MatrixError(f"{path.name}: top level must be a mapping, got {type(raw).__name__}")
    try:
        spec = MatrixFile.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (misspelled? the schema is strict)"
        more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise MatrixError(f"{path.name}: {loc}: {msg}{more}") from None
    _check_naming(spec, path.name)
    _check_references(spec, path.name, path.resolve().parent)
    from .outdated import hold_problems  # a hold names what it is about, which must still be there

    if stale := hold_problems(raw):
        raise MatrixError(
            f"{path.name}: {len(stale)} hold(s) no longer match the matrix (remove each, or point it at "
            "the release or CUDA row it is now about):\n  " + "\n  ".join(stale)
        )
    m = Matrix(spec=spec, path=path)
    m.cells = _expand(spec, path.name)
    return m


# a cell name is a directory under images/ and reports/, a file name under logs/ and a Docker
# repository and tag: one path component of what Docker accepts, and no longer than a tag may be
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
NAME_MAX = 128
NAMING_FIELDS = {
    "base": {"mpi", "ib_tag", "cuda", "cudnn_major", "os"},
    "framework_prefix": {"framework", "framework_version"},
}


def _check_naming(s: MatrixFile, where: str) -> None:
    """naming.base and naming.framework_prefix are format strings of the fields _name passes."""
    for key, fields in NAMING_FIELDS.items():
        pattern = getattr(s.naming, key)
        try:
            used = [f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None]
        except ValueError as e:
            raise MatrixError(f"{where}: naming.{key}: {e} in {pattern!r} (a literal brace is {{{{ or }}}})") from None
        for f in used:
            if f not in fields:
                raise MatrixError(f"{where}: naming.{key}: unknown field {{{f}}} (fields: {', '.join(sorted(fields))})")


def _check_name(name: str, where: str) -> None:
    if len(name) > NAME_MAX:
        raise MatrixError(
            f"{where}: naming: cell name {name[:40]}... is {len(name)} characters, longer than {NAME_MAX}"
        )
    if not NAME_RE.fullmatch(name) or ".." in name:
        raise MatrixError(
            f"{where}: naming: cell name {name!r} is not a safe name (one path component of "
            "a-z 0-9 . _ -, starting with a letter or digit, no '..'): check naming and the axis values"
        )


def _check_references(s: MatrixFile, where: str, root: Path) -> None:
    """Cross-references the schema alone cannot see. Each failure is one line naming the key."""

    def fail(msg: str) -> None:
        raise MatrixError(f"{where}: {msg}")

    tables: dict[str, Mapping[str, object]] = {
        "platform": s.platforms,
        "os": s.os,
        "cuda": s.cuda,
        "mpi": s.mpi,
        "ib": s.ib,
        "framework": s.frameworks,
    }
    for axis in AXES:
        values = getattr(s.axes, axis)
        if len(set(values)) != len(values):
            fail(f"axes.{axis}: duplicate values")
        for v in values:
            if v not in tables[axis]:
                fail(f"axes.{axis}: value {v!r} has no entry in the {TABLE_NAMES.get(axis, axis)} table")
    if "none" not in s.axes.framework:
        fail("axes.framework must include 'none' (the base images every framework image builds on)")

    def artifact(key: str | None, at: str, signing_key: bool = False) -> None:
        if key is not None and key not in s.artifacts:
            fail(f"{at}: unknown artifact {key!r}")
        if key is not None and s.artifacts[key].openpgp_fingerprint and not signing_key:
            fail(
                f"{at}: artifact {key!r} is pinned by an OpenPGP fingerprint, which only a repository "
                "signing key (ib.*.key) may be; pin this file by sha256"
            )

    first = s.axes.platform[0]
    for k, a in s.artifacts.items():
        if a.architecture_specific:
            for plat in s.axes.platform[1:]:
                if plat not in a.platforms:
                    fail(
                        f"artifacts.{k}: architecture_specific, but no file for {plat} (add platforms.{plat}: url, sha256)"
                    )
        for plat in a.platforms:
            if plat not in s.platforms:
                fail(f"artifacts.{k}.platforms: unknown platform {plat!r} (declared: {', '.join(s.platforms)})")
            if plat == first:
                fail(f"artifacts.{k}.platforms.{plat}: the artifact's own url/sha256 are the {plat} file")
    tags = [s.platforms[p].name_tag for p in s.axes.platform]
    if len(set(tags)) != len(tags) or tags[0] != "":
        fail("platforms: name_tag must be empty for the first platform of the axis and distinct for the others")
    for k, row in s.os.items():
        artifact(row.python.installer, f"os.{k}.python.installer")
        if "{cuda_toolkit}" not in row.base and row.cuda_from == "base":
            fail(f"os.{k}.base: a base that brings CUDA must name {{cuda_toolkit}} in its tag")
        if row.cuda_from == "base":
            for ck, crow in s.cuda.items():
                if crow.base_cudnn is None:
                    fail(f"cuda.{ck}.base_cudnn: os.{k} takes cuDNN from its base image, which must say which")
    for k, mpi_row in s.mpi.items():
        artifact(mpi_row.artifact, f"mpi.{k}.artifact")
    for k, ib_row in s.ib.items():
        artifact(ib_row.key, f"ib.{k}.key", signing_key=True)
        families = {o.family for o in s.os.values()}
        for fam, u in ib_row.ucx.items():
            if fam not in families and fam not in s.os:
                fail(f"ib.{k}.ucx.{fam}: neither an OS family ({', '.join(sorted(families))}) nor an os row")
            artifact(u.artifact, f"ib.{k}.ucx.{fam}.artifact")
    for k, fw in s.frameworks.items():
        if fw.parent is not None and fw.parent not in s.frameworks:
            fail(f"frameworks.{k}.parent: unknown framework {fw.parent!r}")
        if k != "none" and not fw.releases:
            fail(f"frameworks.{k}: no releases")
        # A cell takes the first release that lists its CUDA (and matches its parent's): a
        # second one for the same CUDA would never be built, and say nothing about it.
        claimed: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
        for r in fw.releases:
            for c in r.cuda:
                key = (c, tuple(sorted(r.requires.items())))
                if key in claimed:
                    fail(
                        f"frameworks.{k}.releases[{r.version}].cuda: CUDA {c} is already release "
                        f"{claimed[key]}'s: a framework has one release per CUDA row (and parent "
                        f"release), so this one would never be built; take {c} out of {claimed[key]}'s "
                        f"cuda list (or remove {claimed[key]}) to build {r.version} there"
                    )
                claimed[key] = r.version
        dist = canonicalize_name(fw.distribution or k)
        for r in fw.releases:
            at = f"frameworks.{k}.releases[{r.version}]"
            artifact(r.artifact, at + ".artifact")
            # a release's sdist is the release (Horovod's, TransformerEngine's PyTorch extension):
            # a file of another version builds one release under another's name
            if r.artifact and r.artifact in s.artifacts:
                file = s.artifacts[r.artifact].url.rsplit("/", 1)[-1]
                sdist = re.fullmatch(r"[A-Za-z0-9_.]+?-(\d[A-Za-z0-9.]*)\.(?:tar\.gz|tar\.bz2|zip)", file)
                if sdist and sdist.group(1) != r.version:
                    fail(
                        f"{at}.artifact: {r.artifact} is {file} (version {sdist.group(1)}), but the release is "
                        f"{r.version}: the sdist and the release move together"
                    )
            # the release's own wheel is what the release is: a pin of another version (a bump
            # that moved `torch==` but not `version:`) builds one framework under another's name
            for pin in r.packages:
                name, _, pinned = pin.partition("==")
                if canonicalize_name(name.strip()) == dist and pinned.strip() != r.version:
                    fail(
                        f"{at}.packages: {pin.strip()}, but the release is {r.version}: a newer {k} is a "
                        f"new release entry with its own CUDA rows and size (docs/matrix.md), or change "
                        f"`version:` with the pin when the new release is built for the same CUDA rows"
                    )
            for c in r.cuda:
                if c not in s.cuda:
                    fail(f"{at}.cuda: unknown CUDA version {c!r} (declared: {', '.join(s.cuda)})")
                missing = [lib for lib in r.cuda_libraries if lib not in s.cuda[c].libraries]
                if missing:
                    fail(
                        f"{at}.cuda_libraries: CUDA {c} declares no {', '.join(missing)} in cuda.{c}.libraries "
                        f"(declared: {', '.join(s.cuda[c].libraries) or 'none'})"
                    )
            for dep in r.requires:
                if dep not in s.frameworks:
                    fail(f"{at}.requires: unknown framework {dep!r}")
            for plat in r.gpu_code:
                if plat not in s.axes.platform:
                    fail(f"{at}.gpu_code: unknown platform {plat!r} (the axis: {', '.join(s.axes.platform)})")
            if r.gpu_code and not any(isinstance(c, list) for c in r.gpu_code.values()):
                fail(f"{at}.gpu_code: no platform with GPU code: a release with no CUDA build is no GPU framework")
            if r.patch:
                pf = root / r.patch.file
                if not pf.exists():
                    fail(f"{at}.patch: file {r.patch.file} not found")
                actual = hashlib.sha256(pf.read_bytes()).hexdigest()
                if actual != r.patch.sha256:
                    fail(f"{at}.patch: {r.patch.file} has sha256 {actual}, matrix.yaml pins {r.patch.sha256}")
    for rule in s.rules:
        for part in ("when", "require"):
            for axis, values in (getattr(rule, part) or {}).items():
                for v in values:
                    if v not in getattr(s.axes, axis):
                        fail(
                            f"rules[{rule.id}].{part}.{axis}: unknown value {v!r} "
                            f"(declared: {', '.join(getattr(s.axes, axis))})"
                        )
    if len({r.id for r in s.rules}) != len(s.rules):
        fail("rules: duplicate rule ids")
    for name, p in s.profiles.items():
        for axis, values in (p.select or {}).items():
            if axis not in AXES:
                fail(f"profiles.{name}.select: unknown axis {axis!r}")
            for v in [values] if isinstance(values, str) else values:
                if v not in getattr(s.axes, axis):
                    fail(f"profiles.{name}.select.{axis}: unknown value {v!r}")


def _matches(cond: dict[str, list[str]], values: dict[str, str]) -> bool:
    return all(values[a] in allowed for a, allowed in cond.items())


def _as_lists(cond: dict[str, str | list[str]]) -> dict[str, list[str]]:
    """A condition's axes, each with its list of values (the YAML may give one as a string)."""
    return {a: [x] if isinstance(x, str) else list(x) for a, x in cond.items()}


def _cell(v: dict[str, str], **kw: Any) -> Cell:
    """The Cell of axis values V (one per axis) and the rest."""
    return Cell(
        platform=v["platform"], os=v["os"], cuda=v["cuda"], mpi=v["mpi"], ib=v["ib"], framework=v["framework"], **kw
    )


def _name(s: MatrixFile, values: dict[str, str], release: Release | None, parent_name: str | None) -> str:
    ib = s.ib[values["ib"]]
    cuda = s.cuda[values["cuda"]]
    base = (
        s.naming.base.format(
            mpi=values["mpi"], ib_tag=ib.name_tag, cuda=values["cuda"], cudnn_major=cuda.cudnn_major, os=values["os"]
        )
        + s.platforms[values["platform"]].name_tag
    )
    if release is None:
        return base
    prefix = s.naming.framework_prefix.format(framework=values["framework"], framework_version=release.version)
    return prefix + (parent_name or base)


def _expand(s: MatrixFile, where: str) -> list[Cell]:
    """Every combination of the axes, each either included or excluded with its reason.

    Framework cells are resolved after their parents so a child can name its parent and
    inherit its exclusion ("parent excluded: ...")."""
    order = sorted(s.axes.framework, key=lambda f: _depth(s, f))
    resolved: dict[tuple[str, ...], Cell] = {}
    for fw in order:
        for plat, os_, cuda, mpi, ib in itertools.product(
            s.axes.platform, s.axes.os, s.axes.cuda, s.axes.mpi, s.axes.ib
        ):
            values = dict(platform=plat, os=os_, cuda=cuda, mpi=mpi, ib=ib, framework=fw)
            resolved[(plat, os_, cuda, mpi, ib, fw)] = _resolve(s, values, resolved)
    cells = [resolved[k] for k in itertools.product(*(getattr(s.axes, a) for a in AXES))]
    # Names must be unique among cells that exist.
    seen: dict[str, Cell] = {}
    for c in cells:
        _check_name(c.name, where)  # before anything writes images/<name>/ (issue 64)
        if c.excluded:
            continue
        if c.name in seen:
            raise MatrixError(
                f"{where}: two cells render to the same name {c.name!r} "
                f"({seen[c.name].axes} and {c.axes}); give the ib rows distinct name_tag values"
            )
        seen[c.name] = c
    return _assign_profiles(s, cells, where)


def _depth(s: MatrixFile, fw: str, seen: tuple[str, ...] = ()) -> int:
    if fw == "none":
        return 0
    if fw in seen:
        raise MatrixError(f"frameworks.{fw}.parent: cycle through {' -> '.join(seen + (fw,))}")
    parent = s.frameworks[fw].parent or "none"
    return 1 + _depth(s, parent, seen + (fw,))


def _resolve(s: MatrixFile, v: dict[str, str], resolved: dict[tuple[str, ...], Cell]) -> Cell:
    fw = v["framework"]
    release: Release | None = None
    parent: Cell | None = None
    if fw != "none":
        framework = s.frameworks[fw]
        parent_fw = framework.parent or "none"
        parent = resolved[(v["platform"], v["os"], v["cuda"], v["mpi"], v["ib"], parent_fw)]
        candidates = [r for r in framework.releases if v["cuda"] in r.cuda]
        if parent.release is not None:  # a child release must match its parent's version
            candidates = [
                r for r in candidates if r.requires.get(parent_fw, parent.release.version) == parent.release.version
            ]
        release = candidates[0] if candidates else None

    def excluded(reason: str) -> Cell:
        name = (
            _name(s, v, release, parent.name if parent and parent.release else None)
            if (release or fw == "none")
            else f"{fw}-{_name(s, v, None, None)}"
        )
        return _cell(
            v,
            name=name,
            release=release,
            parent=parent.name if parent else None,
            excluded=reason,
            image=_image(s, v, name),
        )

    for rule in s.rules:
        if _matches(_as_lists(rule.when), v) and (rule.require is None or not _matches(_as_lists(rule.require), v)):
            return excluded(f"rule {rule.id}: {' '.join(rule.reason.split())}")
    ib = s.ib[v["ib"]]
    family = s.os[v["os"]].family
    if family not in ib.ucx and v["os"] not in ib.ucx:
        return excluded(f"ib {v['ib']} declares no UCX for {family} rows")
    if fw != "none":
        assert parent is not None  # noqa: S101 -- a framework cell's parent was resolved first (order)
        if parent.excluded:
            return excluded(f"its parent {parent.name} is excluded: {parent.excluded}")
        if release is None:
            avail = "; ".join(f"{r.version} -> CUDA {', '.join(r.cuda)}" for r in s.frameworks[fw].releases)
            need = ""
            if parent.release is not None:
                need = f" built on {parent.framework} {parent.release.version}"
            why = s.frameworks[fw].unreleased_reason
            return excluded(
                f"{fw} has no release for CUDA {v['cuda']}{need} (declared: {avail})"
                + (f": {' '.join(why.split())}" if why else "")
            )
        no_gpu = release.gpu_code.get(v["platform"])
        if isinstance(no_gpu, str):
            return excluded(f"{fw} {release.version} has no CUDA build for {v['platform']}: {' '.join(no_gpu.split())}")
        if release.gpu_code and no_gpu is None:
            return excluded(
                f"{fw} {release.version} declares its wheels' GPU code for {', '.join(release.gpu_code)} only "
                f"(frameworks.{fw}.releases[{release.version}].gpu_code): {v['platform']}'s wheel was never read"
            )
        if release.cuda_compiler != "none" and s.os[v["os"]].cuda_from == "wheels" and not s.cuda[v["cuda"]].compiler:
            return excluded(
                f"{fw} {release.version} compiles CUDA code (cuda_compiler: {release.cuda_compiler}) "
                f"and this OS row takes CUDA from wheels, but cuda.{v['cuda']} declares no compiler "
                f"wheels (cuda.{v['cuda']}.compiler)"
            )
        nccl = s.cuda[v["cuda"]].nccl
        if release.nccl and release.nccl != nccl:
            return excluded(
                f"{fw} {release.version} pins NCCL {release.nccl} but CUDA {v['cuda']} rows ship "
                f"NCCL {nccl}: an image carries one NCCL, so the two must agree"
            )
    name = _name(s, v, release, parent.name if parent and parent.release else None)
    return _cell(v, name=name, release=release, parent=parent.name if parent else None, image=_image(s, v, name))


def _image(s: MatrixFile, v: dict[str, str], name: str) -> str:
    """The repository a cell is published under: its name without the platform tag, so every
    platform of one recipe lands in one multi-arch image index under one tag."""
    return name.removesuffix(s.platforms[v["platform"]].name_tag) if s.platforms[v["platform"]].name_tag else name


def _assign_profiles(s: MatrixFile, cells: list[Cell], where: str) -> list[Cell]:
    from dataclasses import replace

    members: dict[str, list[str]] = {c.name: [] for c in cells}
    by_name = {c.name: c for c in cells if not c.excluded}
    all_names = {c.name: c for c in cells}
    for pname, p in s.profiles.items():
        if p.cells is not None:
            for n in p.cells:
                if n not in by_name:
                    why = f" (excluded: {all_names[n].excluded})" if n in all_names else ""
                    raise MatrixError(f"{where}: profiles.{pname}: no such cell {n!r}{why}")
                members[n].append(pname)
        else:
            cond = _as_lists(p.select or {})
            for c in by_name.values():
                if _matches(cond, c.axes):
                    members[c.name].append(pname)
    return [replace(c, profiles=tuple(members.get(c.name, ()))) if not c.excluded else c for c in cells]


def parse_selects(items: list[str] | None) -> dict[str, list[str]]:
    """--select KEY=VALUE (repeatable; VALUE may be a comma list; repeated keys OR together)."""
    out: dict[str, list[str]] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise MatrixError(f"--select {item!r}: expected KEY=VALUE")
        out.setdefault(key.strip(), []).extend(x.strip() for x in value.split(",") if x.strip())
    return out
