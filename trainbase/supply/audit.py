"""Vulnerability audits as build gates: Python distributions through pip-audit, OS packages
through apt's own view of pending security upgrades. Each audit yields Findings; `evaluate`
weighs them against audit-allowlist.yaml (every entry with a reason and an expiry date) and
returns a verdict that can fail the cell.

Packages that could not be checked are first-class ("unaudited"): an audit that could not reach
its vulnerability data must not read as a clean one. pip-audit itself reports such a package as
skipped, prints "No known vulnerabilities found" and exits 0 (seen on this project's build
machine, see `pip_audit`), so the exit status alone is never trusted."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from trainbase_common import safe_io

from ..errors import TrainbaseError
from .inventory import Package

ALLOWLIST_FILE = "audit-allowlist.yaml"
# Advisory ids the allow-list accepts: CVE, GitHub (GHSA), the PyPA database (PYSEC), OSV's own,
# Debian (DSA/DLA) and Ubuntu (USN) notices.
ADVISORY_ID = re.compile(
    r"^(CVE-\d{4}-\d{4,}|GHSA(-[0-9a-z]{4}){3}|PYSEC-\d{4}-\d+|OSV-\d{4}-\d+"
    r"|DSA-\d+(-\d+)?|DLA-\d+(-\d+)?|USN-\d+-\d+)$",
    re.I,
)
Policy = Literal["require", "warn"]


class AuditError(TrainbaseError):
    """The allow-list is malformed, or an audit tool's output cannot be read."""


# --- the allow-list ----------------------------------------------------------------------------


def _iso_day(v: object) -> object:
    """An expiry is a day written YYYY-MM-DD. The loader keeps YAML timestamps as text, so a bad
    one (2026-02-30, 2026-1-31, a time of day) is reported here, with its entry's number."""
    if isinstance(v, date) and not isinstance(v, datetime):
        return v
    if isinstance(v, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        try:
            return date.fromisoformat(v)
        except ValueError as e:
            raise ValueError(f"expires {v!r} is not a calendar day: {e}") from None
    raise ValueError(f"expires {v!r} is not a day written YYYY-MM-DD")


class _TextDatesLoader(safe_io.UniqueKeyLoader):
    """SafeLoader, except that timestamps stay strings: PyYAML itself raises a bare
    "day is out of range for month" for 2026-02-30, which names no entry. A key given twice in
    one entry is refused (safe_io.UniqueKeyLoader): which reason or expiry holds is not a guess."""


def _timestamp_as_text(loader: _TextDatesLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


_TextDatesLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


class AllowEntry(BaseModel):
    """One accepted finding. It applies through its `expires` day (inclusive) and no longer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    package: str = Field(min_length=1)
    kind: Literal["pypi", "deb", "binary"]  # binary: a language binary a scanner names (Go, Rust, jar)
    reason: str
    expires: Annotated[date, BeforeValidator(_iso_day)]
    cells: tuple[str, ...] | None = None  # cell-name globs; absent = every cell

    @field_validator("id")
    @classmethod
    def _advisory_id(cls, v: str) -> str:
        if not ADVISORY_ID.match(v):
            raise ValueError(f"id {v!r} is not an advisory id (CVE-, GHSA-, PYSEC-, OSV-, DSA-, DLA-, USN-)")
        return v

    @field_validator("reason")
    @classmethod
    def _reasoned(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("reason is blank: say why this finding is acceptable for now")
        return v.strip()

    @field_validator("cells")
    @classmethod
    def _globs(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # An empty list would match no cell: almost surely a mistake, so say so instead.
        if v is not None and (not v or any(not g.strip() for g in v)):
            raise ValueError("cells, when given, must be a non-empty list of cell-name globs")
        return v

    def applies_to(self, cell: str) -> bool:
        return self.cells is None or any(fnmatch.fnmatchcase(cell, g) for g in self.cells)

    def expired(self, today: date) -> bool:
        return today > self.expires


@dataclass(frozen=True)
class Allowlist:
    entries: tuple[AllowEntry, ...] = ()
    source: str = ALLOWLIST_FILE

    @staticmethod
    def number(index: int) -> str:
        """How messages name an entry: #1 is the first one in the file."""
        return f"#{index + 1}"


_ENTRIES = TypeAdapter(list[AllowEntry])


def load_allowlist(path: Path | None) -> Allowlist:
    """None: a project without an allow-list file, so nothing is accepted. A path that does not
    exist is an error: a mistyped path is reported rather than read as an empty list."""
    if path is None:
        return Allowlist((), "(no allow-list)")
    try:
        raw = yaml.load(safe_io.read_text(path), Loader=_TextDatesLoader)  # noqa: S506 (a SafeLoader)
    except FileNotFoundError:
        raise AuditError(f"{path}: no allow-list file (an empty one is `[]`)") from None
    except safe_io.InputError as e:
        raise AuditError(str(e)) from None
    except yaml.YAMLError as e:
        raise AuditError(f"{path}: not valid YAML: {safe_io.yaml_problem(e)}") from None
    if not isinstance(raw, list):
        raise AuditError(f"{path}: the allow-list must be a YAML list of entries (an empty one is `[]`)")
    try:
        entries = tuple(_ENTRIES.validate_python(raw))
    except ValidationError as e:
        problems = []
        for err in e.errors():
            index, *where = err["loc"]
            item = raw[index] if isinstance(index, int) else None
            named = f" ({item.get('id')})" if isinstance(item, dict) and item.get("id") else ""
            fld = ".".join(str(p) for p in where) or "entry"
            problems.append(f"entry {Allowlist.number(int(index))}{named}, field {fld!r}: {err['msg']}")
        raise AuditError(f"{path}: " + "; ".join(problems)) from None
    seen: dict[tuple[Any, ...], int] = {}
    for i, entry in enumerate(entries):
        key = (entry.id.upper(), _canonical(entry.kind, entry.package), entry.kind, entry.cells)
        if key in seen:
            raise AuditError(
                f"{path}: entry {Allowlist.number(i)} repeats entry {Allowlist.number(seen[key])} "
                f"({entry.id} for {entry.package}): keep one, with one reason and one expiry"
            )
        seen[key] = i
    return Allowlist(entries, str(path))


# --- findings and the verdict ------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: Literal["pypi", "deb", "binary"]  # binary: a language binary a scanner names (Go, Rust, jar)
    package: str
    installed: str
    fixed: str  # the first version that fixes it; '' if unknown
    ids: tuple[str, ...]  # advisory id first, then its aliases
    summary: str

    def describe(self) -> str:
        ids = ", ".join(self.ids) if self.ids else "no advisory id known"
        return f"{self.kind} {self.package} {self.installed} -> {self.fixed or 'no fixed version known'} ({ids})"


def _canonical(kind: str, name: str) -> str:
    # PEP 503: PyYAML, pyyaml and py_yaml are one distribution; Debian names are already canonical.
    return re.sub(r"[-_.]+", "-", name).lower() if kind == "pypi" else name.lower()


def _matches(entry: AllowEntry, finding: Finding) -> bool:
    return (
        entry.kind == finding.kind
        and _canonical(entry.kind, entry.package) == _canonical(finding.kind, finding.package)
        and entry.id.upper() in {i.upper() for i in finding.ids}
    )


@dataclass
class AuditVerdict:
    cell: str
    policy: Policy
    allowlist: str
    blocked: list[Finding] = field(default_factory=list)
    allowed: list[tuple[Finding, AllowEntry]] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)  # one message per expired entry that still matched
    unused: list[str] = field(default_factory=list)  # entries in scope for this cell that matched nothing
    unaudited: list[tuple[str, str]] = field(default_factory=list)  # (package, why it could not be checked)

    @property
    def ok(self) -> bool:
        return not self.blocked and (self.policy == "warn" or not self.unaudited)

    def message(self) -> str:
        lines = [
            f"{self.cell}: audit {'passed' if self.ok else 'FAILED'} "
            f"({len(self.blocked)} blocked, {len(self.allowed)} allowed, {len(self.unaudited)} unaudited)"
        ]
        if self.blocked:
            lines.append("blocked findings (each fails the cell):")
            lines += [f"  {f.describe()}" for f in self.blocked]
            lines.append(
                f"  to fix: pypi -> pin the fixed version in matrix.yaml; deb -> rebuild so the image "
                f"takes the security upgrade (a newer base or apt-get upgrade). If a finding does not "
                f"apply, add an entry to {self.allowlist} with its id, a reason and an expiry date."
            )
        lines += [f"  {e}" for e in self.expired]
        if self.unaudited:
            head = (
                "could not be checked, so the audit FAILS (policy require)"
                if self.policy == "require"
                else "could NOT be checked (policy warn: passing, but nothing is known about them)"
            )
            lines.append(f"{len(self.unaudited)} package(s) {head}:")
            lines += [f"  {name}: {why}" for name, why in self.unaudited]
            lines.append(
                "  the vulnerability data could not be reached (pip-audit asks "
                "https://pypi.org/pypi/NAME/VERSION/json, or api.osv.dev with -s osv). Run the audit on "
                "a machine that reaches them: `pip-audit --no-deps --disable-pip --format json "
                "-r requirements.txt` on the image's `pip freeze`; or accept the gap with policy warn."
            )
        if self.allowed:
            lines.append("allowed by the allow-list:")
            lines += [f"  {f.describe()}: {e.reason} (until {e.expires})" for f, e in self.allowed]
        if self.unused:
            lines.append("warning: allow-list entries that matched nothing here (remove them once no cell needs them):")
            lines += [f"  {u}" for u in self.unused]
        return "\n".join(lines)


def evaluate(
    findings: Iterable[Finding],
    allowlist: Allowlist,
    cell: str,
    today: date,
    *,
    unaudited: Sequence[tuple[str, str]] = (),
    policy: Policy = "require",
) -> AuditVerdict:
    """Weigh a cell's findings against the allow-list. An entry allows a finding when it names its
    kind, package and one of its ids (aliases count), its cells globs (if any) match the cell, and
    it has not expired; an expired entry that matches blocks the finding again and says so."""
    if policy not in ("require", "warn"):
        raise ValueError(f"policy {policy!r} is neither 'require' nor 'warn'")
    verdict = AuditVerdict(cell=cell, policy=policy, allowlist=allowlist.source, unaudited=list(unaudited))
    in_scope = [(i, e) for i, e in enumerate(allowlist.entries) if e.applies_to(cell)]
    used: set[int] = set()
    for finding in findings:
        matching = [(i, e) for i, e in in_scope if _matches(e, finding)]
        used |= {i for i, _ in matching}
        live = [e for _, e in matching if not e.expired(today)]
        if live:
            verdict.allowed.append((finding, live[0]))
            continue
        verdict.blocked.append(finding)
        for i, e in matching:
            verdict.expired.append(
                f"allow-list entry {Allowlist.number(i)} for {e.id} ({e.package}) expired on "
                f"{e.expires}: renew it with a new reason or fix the package"
            )
    for i, e in in_scope:
        if i not in used:
            note = f", and it expired on {e.expires}" if e.expired(today) else ""
            verdict.unused.append(f"entry {Allowlist.number(i)}: {e.id} for {e.kind} {e.package}{note}")
    return verdict


# --- Python distributions: pip-audit -----------------------------------------------------------

# What the pinned pip-audit (2.10.1) printed on this project's build machine, for requests==2.19.0
# (known vulnerable: CVE-2018-18074 and later), run as
#   pip-audit -r req.txt --no-deps --disable-pip --format json --progress-spinner off
# stdout: {"dependencies": [{"name": "requests", "skip_reason": "Dependency not found on PyPI and
#          could not be audited: requests (2.19.0)"}], "fixes": []}
# stderr: "No known vulnerabilities found", exit status 0.
# The proxy answers 404 for PyPI's per-version JSON API, which pip-audit reads as "no such
# package". With -s osv it crashed instead (exit 1, no JSON): api.osv.dev does not resolve.
PIP_AUDIT_FLAGS = ("--no-deps", "--disable-pip", "--format", "json", "--progress-spinner", "off")

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)


def _batches(packages: Sequence[Package]) -> list[list[Package]]:
    """pip-audit refuses two pins of one name in one requirements file; an image can hold the
    same distribution in two environments at two versions, so those go to separate runs."""
    batches: list[list[Package]] = []
    for p in sorted(set(packages)):
        for batch in batches:
            if all(_canonical("pypi", q.name) != _canonical("pypi", p.name) for q in batch):
                batch.append(p)
                break
        else:
            batches.append([p])
    return batches


def pip_audit(packages: Sequence[Package], runner: Runner = _run) -> tuple[list[Finding], list[tuple[str, str]]]:
    """Audit the `pypi` packages (other kinds are not pip-audit's business). Returns the findings
    and the packages pip-audit could not check, each with its reason."""
    findings: list[Finding] = []
    unaudited: list[tuple[str, str]] = []
    for batch in _batches([p for p in packages if p.kind == "pypi"]):
        with tempfile.TemporaryDirectory(prefix="tb-pip-audit-") as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text("".join(f"{p.name}=={p.version}\n" for p in batch))
            proc = runner([sys.executable, "-m", "pip_audit", "-r", str(req), *PIP_AUDIT_FLAGS])
        f, u = parse_pip_audit(proc.stdout, batch, returncode=proc.returncode, stderr=proc.stderr or "")
        findings += f
        unaudited += u
    return findings, unaudited


def _first_fix(installed: str, fix_versions: Sequence[str] | None) -> str:
    """The lowest fixing version above the installed one: a fix on an older branch (1.26.18 for
    an installed 2.0.0) is no upgrade path."""
    from packaging.version import InvalidVersion, Version  # a dependency of the pinned pip-audit

    try:
        now = Version(installed)
        later = sorted((Version(f), f) for f in fix_versions or () if Version(f) > now)
    except InvalidVersion:
        later = []
    return later[0][1] if later else (fix_versions[0] if fix_versions else "")


def parse_pip_audit(
    stdout: str, audited: Sequence[Package], *, returncode: int = 0, stderr: str = ""
) -> tuple[list[Finding], list[tuple[str, str]]]:
    """Read pip-audit's JSON. When it produced none (it crashed, e.g. on an unreachable service),
    every package of the run is unaudited with pip-audit's last words as the reason."""
    by_name = {_canonical("pypi", p.name): p for p in audited}
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError:
        last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "no output")
        why = f"pip-audit produced no JSON report (exit {returncode}): {last}"
        return [], [(p.name, why) for p in audited]
    if not isinstance(report, dict) or not isinstance(report.get("dependencies"), list):
        raise AuditError(f"pip-audit's JSON has no 'dependencies' list: {stdout[:200]!r}")
    findings: list[Finding] = []
    unaudited: list[tuple[str, str]] = []
    reported: set[str] = set()
    for dep in report["dependencies"]:
        try:
            key = _canonical("pypi", dep["name"])
            reported.add(key)
            name = by_name[key].name if key in by_name else dep["name"]
            if "skip_reason" in dep:
                unaudited.append((name, dep["skip_reason"]))
                continue
            for v in dep["vulns"]:
                ids = (v["id"], *[a for a in v.get("aliases", []) if a != v["id"]])
                findings.append(
                    Finding(
                        "pypi",
                        name,
                        dep["version"],
                        _first_fix(dep["version"], v.get("fix_versions")),
                        ids,
                        (v.get("description") or "").strip(),
                    )
                )
        except (KeyError, TypeError) as e:
            raise AuditError(f"pip-audit's JSON has an entry of an unknown shape ({e!r}): {dep!r}") from None
    for key, p in by_name.items():
        if key not in reported:
            unaudited.append((p.name, "pip-audit did not report on it"))
    return findings, unaudited


# --- OS packages: apt's pending security upgrades ----------------------------------------------

# Run by the integration in a throwaway container of the image, as root (`--user 0`: updating the
# package lists writes /var/lib/apt/lists). It changes nothing that outlives the container: the
# upgrade is only simulated. `apt-cache policy` goes first so the parser can tell "no security
# upgrade pending" from "no security suite to look in". LC_ALL=C: apt's messages untranslated.
APT_SECURITY_COMMAND = (
    "set -eu; export LC_ALL=C DEBIAN_FRONTEND=noninteractive; "
    "apt-get update -qq >&2; "
    "apt-cache policy; "
    "apt-get -s -o Debug::NoLocking=1 dist-upgrade"
)

# Inst libssl3 [3.0.15-1~deb12u1] (3.0.17-1~deb12u2 Debian-Security:12/stable-security [amd64])
# A new install has no [installed] part; the origins are comma-separated when the version is in
# several suites; a trailing "[]" (broken dependencies in the simulation) may follow.
_INST = re.compile(
    r"^Inst (?P<name>\S+)(?: \[(?P<installed>[^\]]+)\])? "
    r"\((?P<fixed>\S+) (?P<origins>.+?) \[(?P<arch>[^\]]+)\]\)(?: \[.*\])?$"
)
# apt-cache policy: "release v=12,o=Debian,a=stable-security,n=bookworm-security,l=Debian-Security,..."
_SECURITY_RELEASE = re.compile(r"^\s*release .*\b[an]=[\w.-]+-security\b", re.M)


def _security_suites(origins: str) -> list[str]:
    # Debian-Security:12/stable-security, Ubuntu:24.04/noble-security, UbuntuESMApps:24.04/noble-apps-security
    return [o.strip() for o in origins.split(",") if o.strip().rsplit("/", 1)[-1].endswith("-security")]


def apt_security_findings(apt_output: str, *, require_security_source: bool = True) -> list[Finding]:
    """The upgrades apt would take from a security suite: each is a finding (the installed version
    has a fix published). Upgrades from regular suites (point releases, -updates) are not.
    With `require_security_source`, output in which no security suite appears at all (no
    `apt-cache policy` release line, no security upgrade) is refused: the audit was blind."""
    findings: list[Finding] = []
    for line in apt_output.splitlines():
        if not line.startswith("Inst "):
            continue
        m = _INST.match(line.rstrip())
        if not m:
            raise AuditError(f"unreadable line in apt's simulated upgrade: {line!r}")
        suites = _security_suites(m["origins"])
        if not suites or not m["installed"]:  # a regular update, or a new package pulled in
            continue
        findings.append(Finding("deb", m["name"].split(":", 1)[0], m["installed"], m["fixed"], (), ", ".join(suites)))
    if require_security_source and not findings and not _SECURITY_RELEASE.search(apt_output):
        raise AuditError(
            "apt knows no security suite in this image (no '-security' release in apt-cache policy): "
            "the OS audit cannot see security upgrades. Check the image's apt sources, and that "
            "the output comes from APT_SECURITY_COMMAND"
        )
    return findings
