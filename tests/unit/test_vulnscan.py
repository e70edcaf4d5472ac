"""The promotion gate's vulnerability scan (trainbase/supply/vulnscan.py) on Trivy- and
Grype-shaped reports (tests/unit/fixtures/scans: the fields each scanner writes, values chosen
for each rule): a fixable critical blocks, an unfixable one and a fixable high do not, an
allow-list entry accepts until it expires, a report that is not one fails, and promotion holds
back a digest the scan failed, or never scanned, even when its GPU tier passed."""

import json

import pytest

from trainbase.deliver import promote
from trainbase.supply import vulnscan

from .conftest import ROOT

SCANS = ROOT / "tests" / "unit" / "fixtures" / "scans"
REF = "ghcr.io/example/trainbase/x@sha256:" + "a" * 64
CELL = "openmpi4.1.4-cuda12.8-cudnn9-ubuntu22.04"


def run(tmp_path, report, *extra):
    return vulnscan.main(
        [
            str(report),
            "--ref",
            REF,
            "--cell",
            CELL,
            "--gate-dir",
            str(tmp_path / "gate"),
            "--allowlist",
            str(tmp_path / "allow.yaml"),
            "--today",
            "2026-11-26",
            *extra,
        ]
    )


@pytest.fixture
def allow(tmp_path):
    (tmp_path / "allow.yaml").write_text("[]\n")
    return tmp_path / "allow.yaml"


@pytest.mark.parametrize("report", ["trivy-critical-fixable.json", "grype-critical-fixable.json"])
def test_a_fixable_critical_blocks_and_the_record_says_which(tmp_path, allow, capsys, report):
    assert run(tmp_path, SCANS / report) == 1
    out = capsys.readouterr().out
    assert "scan gate FAILED" in out and "openssh-client" in out and "CVE-2024-6387" in out
    assert "libc6" not in out.split("blocked findings")[1].split("to fix")[0], "an unfixed critical does not block"
    record = json.loads((tmp_path / "gate" / f"scan-{CELL}.json").read_text())
    assert record["passed"] is False and record["check"] == vulnscan.CHECK and record["ref"] == REF
    assert record["counts"]["critical unfixed"] == 1


def test_every_scanner_type_maps_to_an_allow_list_kind():
    _, findings = vulnscan.read_report(SCANS / "trivy-critical-fixable.json")
    kinds = {f.finding.package: f.finding.kind for f in findings}
    assert kinds == {"openssh-client": "deb", "libc6": "deb", "libc-bin": "deb", "setuptools": "pypi"}
    setuptools = next(f.finding for f in findings if f.finding.package == "setuptools")
    assert setuptools.fixed == "78.1.1" and "GHSA-xxxx-yyyy-zzzz" in setuptools.ids


def test_an_allow_list_entry_accepts_a_finding_until_it_expires(tmp_path, capsys):
    (tmp_path / "allow.yaml").write_text(
        "- {id: CVE-2024-6387, package: openssh-client, kind: deb, reason: 'sshd is not installed; the client is "
        "not exposed', expires: 2026-12-31}\n"
        "- {id: GHSA-xxxx-yyyy-zzzz, package: setuptools, kind: pypi, reason: 'build-time only', expires: 2026-12-31}\n"
    )
    assert run(tmp_path, SCANS / "trivy-critical-fixable.json") == 0
    assert "scan gate passed" in capsys.readouterr().out
    assert json.loads((tmp_path / "gate" / f"scan-{CELL}.json").read_text())["passed"] is True
    assert run(tmp_path, SCANS / "trivy-critical-fixable.json", "--today", "2027-01-01") == 1
    assert "expired on 2026-12-31" in capsys.readouterr().out


def test_a_report_that_is_not_one_never_passes(tmp_path, allow, capsys):
    for text in ("", "{}", '{"SchemaVersion": 2, "ArtifactName": "x", "Results": [{"Vulnerabilities": [{}]}]}'):
        (tmp_path / "bad.json").write_text(text)
        assert run(tmp_path, tmp_path / "bad.json") == 2
        assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "gate").exists()
    assert vulnscan.main([str(SCANS / "trivy-critical-fixable.json"), "--ref", "x:latest", "--cell", CELL]) == 2


def verdict(gate_dir, ref):
    """(missing, failed) for REF, the digest of a single-platform (amd64) cell, as promotion
    weighs the records in ``gate_dir``."""
    repo, digest = ref.split("@")
    step = promote.Step("x", f"{repo}:r1", f"{repo}:latest", digest, None, promote.required_checks(["linux/amd64"]))
    return promote.verdict(promote.read_gate(gate_dir), step)


def test_promotion_needs_every_required_check_to_pass_for_the_digest(tmp_path):
    """What a digest needs is what its cells require, not what left a record: a run whose scan
    jobs never ran holds every digest (it used to pass them on the GPU tier alone)."""
    gate = tmp_path / "gate"
    other = "ghcr.io/example/trainbase/y@sha256:" + "b" * 64
    (gate / "gpu-x").mkdir(parents=True)
    (gate / "gpu-x" / "gate.json").write_text(
        json.dumps({"ref": REF, "passed": True, "check": "gpu", "platform": "linux/amd64"})
    )
    (gate / "gpu-y").mkdir()
    (gate / "gpu-y" / "gate.json").write_text(
        json.dumps({"ref": other, "passed": True, "check": "gpu", "platform": "linux/amd64"})
    )
    assert verdict(gate, REF) == verdict(gate, other) == ([vulnscan.CHECK], [])  # only the GPU tier ran
    (gate / "scan-x").mkdir()
    (gate / "scan-x" / "s.json").write_text(json.dumps({"ref": REF, "passed": False, "check": vulnscan.CHECK}))
    assert verdict(gate, REF) == ([], [vulnscan.CHECK]), "x failed the scan"
    assert verdict(gate, other) == ([vulnscan.CHECK], []), "y was never scanned"
    (gate / "scan-y").mkdir()
    (gate / "scan-y" / "s.json").write_text(json.dumps({"ref": other, "passed": True, "check": vulnscan.CHECK}))
    assert verdict(gate, other) == ([], [])


def test_a_gpu_record_that_names_no_platform_passes_no_platform(tmp_path):
    """A record in the old shape (no check, no platform) answers for no runner's platform."""
    (tmp_path / "gate.json").write_text(json.dumps({"ref": REF, "passed": True}))
    (tmp_path / "scan.json").write_text(json.dumps({"ref": REF, "passed": True, "check": vulnscan.CHECK}))
    assert verdict(tmp_path, REF) == (["gpu[linux/amd64]"], [])
