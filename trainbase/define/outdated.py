"""`build.py --outdated`: which versions matrix.yaml pins that upstream has moved past.

A pin is meant to hold still -- that is what makes a recipe tag reproducible -- but a pin
nobody looks at ages silently (Intel MPI 2021.18 while PyPI has 2021.19, an NCCL two minors
behind). This reads every PyPI pin the matrix declares (``name==version`` in a package list,
``{package: NAME, version: V}`` for the CUDA wheels) and asks PyPI's JSON API for the releases
of each package: the newest final release in the pin's own series (major.minor: a safe bump)
and the newest overall. It changes nothing: refresh.yml puts the report into its pull request
and a person decides.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

PYPI_JSON = "https://pypi.org/pypi/{name}/json"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)$")


@dataclass
class Pin:
    package: str
    version: str
    where: list[str] = field(default_factory=list)  # matrix.yaml paths that pin it


@dataclass
class Finding:
    pin: Pin
    newest_in_series: str | None  # None: the pin is the newest of its major.minor (of what no hold holds)
    newest: str | None  # None: the pin is the newest release (of what no hold holds)
    error: str = ""
    held: str = ""  # newer releases a hold of matrix.yaml holds back, and why


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def holds(matrix_file: Path) -> dict[str, list[dict[str, Any]]]:
    """matrix.yaml's ``holds``, by normalized package name (a package may have several, each
    for the pins at its own ``where``). Each carries ``_at``: its ``where`` as the path the
    pins are found at (``frameworks.pytorch.releases[version=2.10.0]`` ->
    ``frameworks.pytorch.releases[0]``, where that release is today), None if it names nothing."""
    data = yaml.safe_load(matrix_file.read_text()) or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for written in data.get("holds") or []:
        h = {**written, "_at": resolve_where(data, written["where"]) if written.get("where") else None}
        for name in [h["package"]] if isinstance(h["package"], str) else h["package"]:
            out.setdefault(_norm(name), []).append(h)
    return out


_SELECTOR = re.compile(r"\[([A-Za-z_]+)=([^\]]+)\]")
POSITION = re.compile(r"\[\d+\]")


def resolve_where(data: Any, where: str) -> str | None:
    """``where`` (a matrix.yaml path whose list items are named by a field,
    ``frameworks.pytorch.releases[version=2.10.0]``; mapping keys may hold dots, ``cuda.12.8``)
    as the positional path the pins are found at, or None where it names nothing in ``data``."""
    node, rest, out = data, where, ""
    while rest:
        if isinstance(node, list) and (m := _SELECTOR.match(rest)):
            key, value = m.groups()
            found = [i for i, item in enumerate(node) if isinstance(item, dict) and str(item.get(key)) == value]
            if not found:
                return None
            node, out, rest = node[found[0]], f"{out}[{found[0]}]", rest[m.end() :].lstrip(".")
        elif isinstance(node, dict):
            fits = [k for k in map(str, node) if rest == k or rest.startswith((k + ".", k + "["))]
            if not fits:
                return None
            k = max(fits, key=len)
            node = next(v for kk, v in node.items() if str(kk) == k)
            out, rest = f"{out}.{k}" if out else k, rest[len(k) :].lstrip(".")
        else:
            return None
    return out


def _applies(hold: dict[str, Any], pin: Pin) -> bool:
    if not hold.get("where"):
        return True
    at = hold["_at"] if "_at" in hold else hold["where"]
    return at is not None and any(w == at or w.startswith((at + ".", at + "[")) for w in pin.where)


def hold_problems(data: dict[str, Any]) -> list[str]:
    """One line per hold of matrix.yaml that no longer says anything: its ``where`` names a
    release, CUDA row or table that is gone, or none of its packages is pinned there (the
    release it was written for was replaced), or every pin is already past its ``below``.
    Each line quotes the hold's reason, so the person who removes a version sees what it held."""
    pinned = _pins_of(data)
    out = []
    for i, h in enumerate(data.get("holds") or []):
        names = [h["package"]] if isinstance(h["package"], str) else list(h["package"])
        what = f"holds[{i}] ({', '.join(names)}{', where: ' + h['where'] if h.get('where') else ''})"
        why = f"reason: {' '.join(str(h.get('reason', '')).split())}"
        at = resolve_where(data, h["where"]) if h.get("where") else None
        if h.get("where") and at is None:
            out.append(f"{what}: names nothing in matrix.yaml any more (a dropped version?); {why}")
            continue
        hold = {**h, "_at": at}
        mine = [p for p in pinned if p.package in {_norm(n) for n in names} and _applies(hold, p)]
        if not mine:
            out.append(f"{what}: pins none of its packages there any more; {why}")
        elif (
            h.get("below")
            and _ok(str(h["below"]))
            and all(_ok(p.version) and Version(p.version) >= Version(str(h["below"])) for p in mine)
        ):
            out.append(f"{what}: every pin is already at or past {h['below']}, so it holds nothing; {why}")
    return out


def _holds_back(hold: dict[str, Any], mine: Version, v: Version) -> bool:
    """Whether ``hold`` keeps release ``v`` out of a pin at ``mine``."""
    bound = Version(hold["below"]) if hold.get("below") else None
    if hold.get("series") or bound is not None:
        return bool((hold.get("series") and v.release[:2] != mine.release[:2]) or (bound is not None and v >= bound))
    return True


def _walk(node: Any, path: str) -> Iterator[tuple[str, str, str]]:
    if isinstance(node, dict):
        if isinstance(node.get("package"), str) and node.get("version") is not None:
            yield node["package"], str(node["version"]), path
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, str) and (m := _PIN.match(v.strip())):
                yield m.group(1), m.group(2), f"{path}[{i}]"
            else:
                yield from _walk(v, f"{path}[{i}]")


def pins(matrix_file: Path) -> list[Pin]:
    """Every PyPI pin of matrix.yaml, one per (package, version), with where it is pinned."""
    return _pins_of(yaml.safe_load(matrix_file.read_text()))


def _pins_of(data: dict[str, Any]) -> list[Pin]:
    found: dict[tuple[str, str], Pin] = {}
    data = {k: v for k, v in data.items() if k != "holds"}  # what is held is not a pin
    for name, version, where in _walk(data, ""):
        key = (_norm(name), version)
        found.setdefault(key, Pin(key[0], version)).where.append(where)
    return sorted(found.values(), key=lambda p: (p.package, Version(p.version) if _ok(p.version) else p.version))


def _ok(v: str) -> bool:
    try:
        Version(v)
        return True
    except InvalidVersion:
        return False


def fetch_releases(package: str) -> list[str]:
    """Every non-yanked release version PyPI lists for ``package``."""
    import requests

    r = requests.get(PYPI_JSON.format(name=package), timeout=30)
    r.raise_for_status()
    return [v for v, files in r.json()["releases"].items() if files and not all(f.get("yanked") for f in files)]


def compare(pin: Pin, releases: list[str], holds: list[dict[str, Any]] | dict[str, Any] | None = None) -> Finding:
    finals = sorted(v for v in map(_version_or_none, releases) if v is not None and not v.is_prerelease)
    mine = Version(pin.version)
    said = []
    for hold in [holds] if isinstance(holds, dict) else holds or []:
        if not _applies(hold, pin):
            continue
        newer_held = [v for v in finals if v > mine and _holds_back(hold, mine, v)]
        if newer_held:
            why = hold["reason"].strip() + (f" ({hold['upstream']})" if hold.get("upstream") else "")
            scope = ([f">= {hold['below']}"] if hold.get("below") else []) + (
                ["outside its series"] if hold.get("series") else []
            )
            scope_text = f" ({' or '.join(scope)})" if scope else ""
            said.append(
                f"{', '.join(map(str, newer_held[-3:]))}{' ...' if len(newer_held) > 3 else ''} held{scope_text}: {why}"
            )
        finals = [v for v in finals if v <= mine or not _holds_back(hold, mine, v)]
    held = "; ".join(said)
    series = [v for v in finals if v.release[:2] == mine.release[:2]]
    newest_in_series = str(series[-1]) if series and series[-1] > mine else None
    newest = str(finals[-1]) if finals and finals[-1] > mine else None
    return Finding(pin, newest_in_series, newest, held=held)


def _version_or_none(v: str) -> Version | None:
    try:
        return Version(v)
    except InvalidVersion:
        return None


def _split_by_holds(pin: Pin, package_holds: list[dict[str, Any]]) -> list[Pin]:
    """One pin per set of holds that apply: a version two rows pin, one of them held (its
    PyTorch requires exactly it), is behind on the row no hold covers, and says so."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for w in pin.where:
        applying = tuple(i for i, h in enumerate(package_holds) if _applies(h, Pin(pin.package, pin.version, [w])))
        groups.setdefault(applying, []).append(w)
    return [Pin(pin.package, pin.version, where) for where in groups.values()]


def check(matrix_file: Path, releases: Callable[[str], list[str]] = fetch_releases) -> list[Finding]:
    out = []
    held = holds(matrix_file)
    releases = functools.cache(releases)  # a package split by its holds is asked for once
    for pin in (p for found in pins(matrix_file) for p in _split_by_holds(found, held.get(found.package, []))):
        if not _ok(pin.version):
            continue
        try:
            out.append(compare(pin, releases(pin.package), held.get(pin.package)))
        except Exception as e:  # noqa: BLE001 -- a report: one package PyPI cannot answer for is a line, not a crash
            out.append(Finding(pin, None, None, error=f"{type(e).__name__}: {e}"[:200]))
    return out


def as_json(findings: list[Finding]) -> list[dict[str, Any]]:
    """One object per pin (``--outdated --json``), for a dashboard or a bot."""
    return [
        {
            "package": f.pin.package,
            "pinned": f.pin.version,
            "newest_in_series": f.newest_in_series,
            "newest": f.newest,
            "where": f.pin.where,
            **({"error": f.error} if f.error else {}),
            **({"held": f.held} if f.held else {}),
        }
        for f in findings
    ]


def report(findings: list[Finding]) -> str:
    """Markdown: the pins upstream moved past, newest first in importance (a series bump is a
    safe refresh; a newer series needs a matrix entry), then the current ones in one line."""
    behind = [f for f in findings if f.newest or f.error]
    lines = ["| package | pinned | newest in its series | newest | pinned at |", "|---|---|---|---|---|"]
    for f in behind:
        if f.error:
            lines.append(f"| {f.pin.package} | {f.pin.version} | ? | ? ({f.error}) | {', '.join(f.pin.where[:2])} |")
        else:
            lines.append(
                f"| {f.pin.package} | {f.pin.version} | {f.newest_in_series or '-'} | {f.newest} | "
                f"{', '.join(f.pin.where[:2])}{' ...' if len(f.pin.where) > 2 else ''} |"
            )
    held = [f for f in findings if f.held]
    current = sorted({f.pin.package for f in findings if not (f.newest or f.error)})
    head = f"{len(behind)} of {len(findings)} pins have newer releases on PyPI" + (
        f"; {len(held)} hold(s) of matrix.yaml keep newer releases out, each with its reason" if held else ""
    )
    held_lines = (
        [
            "| package | pinned | held |",
            "|---|---|---|",
            *(f"| {f.pin.package} | {f.pin.version} | {f.held} |" for f in held),
        ]
        if held
        else []
    )
    return "\n".join(
        [
            head,
            "",
            *(lines if behind else []),
            "",
            *held_lines,
            *([""] if held else []),
            f"current: {', '.join(current) or 'none'}",
        ]
    )


def command(matrix_path: Path, json_output: bool = False) -> int:
    """`build.py --outdated [--json]`: the table (or one JSON object per pin); changes nothing."""
    import json

    findings = check(matrix_path)
    print(json.dumps(as_json(findings), indent=2) if json_output else report(findings))
    return 0
