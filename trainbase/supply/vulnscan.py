"""The promotion gate's vulnerability scan: an image scanner's report (Trivy or Grype JSON) of
one published digest, weighed against the same allow-list as the build's audit
(audit-allowlist.yaml), written as a gate record for `build.py --promote --gate`.

Policy: a **critical** finding **with a fixed version** blocks promotion unless an unexpired,
reasoned allow-list entry accepts it. Unfixable criticals and fixable highs are reported (the
counts in the record and the summary) but do not block: nothing the image owner can do about
an unfixed CVE today, and the nightly security rebuild picks fixes up as they land.

The scanner runs in CI (gpu.yml's scan job: trivy-action, pinned) where its database can be
downloaded; neither Trivy's nor Grype's database is reachable from the build machine, so
here the gate is tested on recorded reports (tests/unit/test_vulnscan.py).

    python -m trainbase.supply.vulnscan SCAN.json --ref HOST/REPO@sha256:... --cell NAME \\
        [--platform OS/ARCH] [--allowlist audit-allowlist.yaml] [--gate-dir gate/] [--today YYYY-MM-DD]

Exit 0 when nothing blocks, 1 when something does (named), 2 on a report it cannot read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Literal

from trainbase_common import safe_io

from ..errors import TrainbaseError
from .audit import AuditVerdict, Finding, evaluate, load_allowlist

Kind = Literal["pypi", "deb", "binary"]  # audit.Finding.kind

CHECK = "vulnerability-scan"
BLOCKING_SEVERITY = "CRITICAL"


@dataclass(frozen=True)
class ScanFinding:
    finding: Finding
    severity: str  # CRITICAL, HIGH, MEDIUM, LOW, UNKNOWN


class ScanReportError(Exception):
    pass


def _trivy(doc: dict[str, Any]) -> list[ScanFinding]:
    out = []
    for result in doc.get("Results") or []:
        klass, typ = result.get("Class", ""), result.get("Type", "")
        kind: Kind = "deb" if klass == "os-pkgs" else "pypi" if typ == "python-pkg" else "binary"
        for v in result.get("Vulnerabilities") or []:
            ids = (v["VulnerabilityID"], *(a for a in v.get("VendorIDs") or [] if a != v["VulnerabilityID"]))
            out.append(
                ScanFinding(
                    Finding(
                        kind,
                        v["PkgName"],
                        v.get("InstalledVersion", ""),
                        (v.get("FixedVersion") or "").split(",")[0].strip(),
                        tuple(ids),
                        v.get("Title", ""),
                    ),
                    str(v.get("Severity", "UNKNOWN")).upper(),
                )
            )
    return out


def _grype(doc: dict[str, Any]) -> list[ScanFinding]:
    out = []
    for m in doc.get("matches") or []:
        v, a = m["vulnerability"], m["artifact"]
        typ = a.get("type", "")
        kind: Kind = "deb" if typ == "deb" else "pypi" if typ == "python" else "binary"
        fix = v.get("fix") or {}
        fixed = (fix.get("versions") or [""])[0] if fix.get("state") == "fixed" else ""
        ids = (v["id"], *(r["id"] for r in m.get("relatedVulnerabilities") or [] if r.get("id") != v["id"]))
        out.append(
            ScanFinding(
                Finding(kind, a["name"], a.get("version", ""), fixed, tuple(ids), v.get("description", "")[:200]),
                str(v.get("severity", "Unknown")).upper(),
            )
        )
    return out


def read_report(path: Path) -> tuple[str, list[ScanFinding]]:
    """(scanner, findings) of a Trivy (`trivy image --format json`) or Grype (`grype -o json`)
    report; ScanReportError when it is neither (an empty or truncated file must never pass)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ScanReportError(f"{path}: not a scan report ({e})") from None
    try:
        if isinstance(doc, dict) and "SchemaVersion" in doc and "ArtifactName" in doc:
            return "trivy", _trivy(doc)
        if isinstance(doc, dict) and "matches" in doc and "descriptor" in doc:
            return f"grype {doc['descriptor'].get('version', '')}".strip(), _grype(doc)
    except (KeyError, TypeError, AttributeError) as e:
        raise ScanReportError(f"{path}: a scan report without {e}") from None
    raise ScanReportError(f"{path}: neither a Trivy nor a Grype JSON report")


def gate(
    findings: list[ScanFinding], allowlist_path: Path | None, cell: str, today: date
) -> tuple[AuditVerdict, Counter[str]]:
    """The verdict over the blocking findings (critical, fixable), and counts of the rest."""
    blocking = [s.finding for s in findings if s.severity == BLOCKING_SEVERITY and s.finding.fixed]
    counts = Counter(f"{s.severity.lower()} {'fixable' if s.finding.fixed else 'unfixed'}" for s in findings)
    # policy require: nothing "unaudited" here -- the scanner answered for the whole image
    return evaluate(blocking, load_allowlist(allowlist_path), cell, today), counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainbase.supply.vulnscan", description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path)
    p.add_argument("--ref", required=True, help="the scanned image, by digest (HOST/REPO@sha256:...)")
    p.add_argument("--cell", required=True)
    p.add_argument(
        "--platform",
        default="",
        help="the platform whose manifest was scanned (OS/ARCH): a scanner given a multi-arch index "
        "scans one platform, and the gate requires a record for each (deliver/promote.py)",
    )
    p.add_argument("--allowlist", type=Path, default=Path("audit-allowlist.yaml"))
    p.add_argument("--gate-dir", type=Path, help="write the gate record (pass or fail) here")
    p.add_argument("--today", type=date.fromisoformat, default=date.today())
    a = p.parse_args(argv)
    if "@sha256:" not in a.ref:
        print(f"error: --ref {a.ref!r}: the gate records digests only (HOST/REPO@sha256:...)", file=sys.stderr)
        return 2
    try:
        scanner, findings = read_report(a.report)
        verdict, counts = gate(findings, a.allowlist, a.cell, a.today)
    except (ScanReportError, TrainbaseError) as e:  # TrainbaseError: a malformed allow-list
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no findings"
    print(f"{a.cell}: {scanner}: {summary}")
    print(verdict.message().replace("audit passed", "scan gate passed").replace("audit FAILED", "scan gate FAILED"))
    if a.gate_dir:
        a.gate_dir.mkdir(parents=True, exist_ok=True)
        record = {
            "ref": a.ref,
            "check": CHECK,
            **({"platform": a.platform} if a.platform else {}),
            "passed": verdict.ok,
            "scanner": scanner,
            "counts": dict(counts),
            "blocking": [f.describe() for f in verdict.blocked],
            "allowed": [f"{f.describe()}: {e.reason}" for f, e in verdict.allowed],
        }
        safe_io.atomic_write(a.gate_dir / f"scan-{a.cell}.json", json.dumps(record, indent=2) + "\n")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
