"""Audits as build gates (trainbase/supply/audit.py): the allow-list's strict schema, the verdict
(allowed, blocked, expired, unused, cell globs, aliases, unaudited packages under each policy),
pip-audit's JSON read from recorded outputs, and apt's simulated upgrade read for security
upgrades only. No network: pip-audit runs through an injected runner."""

import json
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from trainbase.supply.audit import (
    APT_SECURITY_COMMAND,
    PIP_AUDIT_FLAGS,
    AuditError,
    Finding,
    apt_security_findings,
    evaluate,
    load_allowlist,
    parse_pip_audit,
    pip_audit,
)
from trainbase.supply.inventory import Package

from .conftest import ROOT

FIX = Path(__file__).parent / "fixtures" / "audit"
TODAY = date(2026, 1, 15)
CELL = "openmpi4.1.4-cuda12.8-cudnn9-debian12"

URLLIB3_OK = """
- id: CVE-2021-33503
  package: urllib3
  kind: pypi
  reason: only the proxy-authority parser is affected; the images never pass urllib3 untrusted URLs
  expires: {expires}
"""


def allowlist(tmp_path: Path, text: str):
    path = tmp_path / "audit-allowlist.yaml"
    path.write_text(text)
    return load_allowlist(path)


def recorded_runner(stdout: str, returncode: int = 1, stderr: str = ""):
    """A pip-audit stand-in that answers with a recorded report and keeps what it was asked."""
    calls = []

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        req = Path(argv[argv.index("-r") + 1])
        calls.append((argv, req.read_text()))
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    run.calls = calls
    return run


def planted() -> list[Package]:
    return [
        Package("pypi", "urllib3", "1.26.4"),
        Package("pypi", "requests", "2.19.0"),
        Package("pypi", "PyYAML", "6.0.3"),
        Package("pypi", "torch", "2.9.1+cu128"),
        Package("deb", "libssl3", "3.0.15-1~deb12u1"),
    ]


def urllib3_finding() -> Finding:
    return Finding(
        "pypi",
        "urllib3",
        "1.26.4",
        "1.26.5",
        ("PYSEC-2021-108", "CVE-2021-33503", "GHSA-q2q7-5pp4-w6pg"),
        "catastrophic backtracking in the authority regex",
    )


# --- the allow-list file -----------------------------------------------------------------------


def test_the_repository_allowlist_loads():
    assert load_allowlist(ROOT / "audit-allowlist.yaml").entries == ()


def test_a_valid_entry_loads_with_quoted_or_unquoted_date(tmp_path):
    a = allowlist(
        tmp_path,
        URLLIB3_OK.format(expires="2026-01-31")
        + URLLIB3_OK.format(expires="'2026-02-28'").replace("urllib3\n", "urllib3\n  cells: ['*-ubuntu24.04']\n"),
    )
    assert [e.expires for e in a.entries] == [date(2026, 1, 31), date(2026, 2, 28)]
    assert a.entries[1].cells == ("*-ubuntu24.04",)


def entry(**change) -> str:
    """The urllib3 entry with fields replaced (a value of None drops the field)."""
    fields = {
        "id": "CVE-2021-33503",
        "package": "urllib3",
        "kind": "pypi",
        "reason": "the images never pass urllib3 untrusted URLs",
        "expires": "2026-01-31",
        **change,
    }
    return "- " + "\n  ".join(f"{k}: {v}" for k, v in fields.items() if v is not None) + "\n"


@pytest.mark.parametrize(
    "broken, expected",
    [
        (entry(owner="me"), "entry #2 (CVE-2021-33503), field 'owner': Extra inputs are not permitted"),
        (entry(reason=None), "entry #2 (CVE-2021-33503), field 'reason': Field required"),
        (entry(reason="'   '"), "entry #2 (CVE-2021-33503), field 'reason': Value error, reason is blank"),
        (entry(reason="''"), "field 'reason': Value error, reason is blank"),
        (
            entry(expires="2026-02-30"),
            "entry #2 (CVE-2021-33503), field 'expires': Value error, expires '2026-02-30' is not a calendar day",
        ),
        (
            entry(expires="'31/01/2026'"),
            "field 'expires': Value error, expires '31/01/2026' is not a day written YYYY-MM-DD",
        ),
        (
            entry(expires="2026-01-31 12:00:00"),
            "field 'expires': Value error, expires '2026-01-31 12:00:00' is not a day written YYYY-MM-DD",
        ),
        (entry(expires=None), "field 'expires': Field required"),
        (entry(id="CVE2021"), "entry #2 (CVE2021), field 'id': Value error, id 'CVE2021' is not an advisory id"),
        (entry(kind="npm"), "field 'kind': Input should be 'pypi', 'deb' or 'binary'"),
        (entry(package=123), "field 'package': Input should be a valid string"),
        (entry(cells="[]"), "field 'cells': Value error, cells, when given, must be a non-empty list"),
        ("- just-a-string\n", "entry #2, field 'entry': Input should be a valid dictionary"),
    ],
)
def test_allowlist_schema_errors_name_the_entry_and_field(tmp_path, broken, expected):
    # A valid entry first, so the broken one is #2: the number follows the file's order, from #1.
    with pytest.raises(AuditError) as e:
        allowlist(tmp_path, entry(cells="[never]") + broken)
    assert expected in str(e.value)
    assert "entry #2" in str(e.value) and "entry #1" not in str(e.value)


@pytest.mark.parametrize("text", ["id: CVE-2021-33503\n", "", "- [unclosed\n"])
def test_allowlist_that_is_not_a_yaml_list_is_an_error(tmp_path, text):
    with pytest.raises(AuditError, match="must be a YAML list|not valid YAML"):
        allowlist(tmp_path, text)


def test_missing_allowlist_file_is_an_error_and_none_accepts_nothing(tmp_path):
    with pytest.raises(AuditError, match="no allow-list file"):
        load_allowlist(tmp_path / "absent.yaml")
    assert not evaluate([urllib3_finding()], load_allowlist(None), CELL, TODAY).ok


def test_a_repeated_entry_is_an_error(tmp_path):
    with pytest.raises(AuditError, match="entry #2 repeats entry #1"):
        allowlist(tmp_path, URLLIB3_OK.format(expires="2026-01-31") + URLLIB3_OK.format(expires="2027-01-31"))


# --- the verdict -------------------------------------------------------------------------------


def test_planted_vulnerable_pin_fails_then_passes_with_a_reason_then_fails_when_expired(tmp_path):
    findings, unaudited = pip_audit(
        [Package("pypi", "urllib3", "1.26.4")], runner=recorded_runner((FIX / "pip-audit-vulnerable.json").read_text())
    )
    urllib3 = [f for f in findings if f.package == "urllib3"]

    bare = evaluate(urllib3, allowlist(tmp_path, "[]"), CELL, TODAY)
    assert not bare.ok and bare.blocked == urllib3
    assert "urllib3 1.26.4 -> 1.26.5 (PYSEC-2021-108, CVE-2021-33503, GHSA-q2q7-5pp4-w6pg)" in bare.message()
    assert CELL in bare.message() and "FAILED" in bare.message()

    entry = allowlist(tmp_path, URLLIB3_OK.format(expires="2026-01-31"))
    allowed = evaluate(urllib3, entry, CELL, TODAY)
    assert allowed.ok and not allowed.blocked and allowed.allowed[0][0] == urllib3[0]
    assert evaluate(urllib3, entry, CELL, date(2026, 1, 31)).ok, "the expiry day itself still applies"

    late = evaluate(urllib3, entry, CELL, date(2026, 2, 1))
    assert not late.ok and late.blocked == urllib3
    assert late.expired == [
        "allow-list entry #1 for CVE-2021-33503 (urllib3) expired on 2026-01-31: "
        "renew it with a new reason or fix the package"
    ]
    assert late.expired[0] in late.message()
    assert late.unused == [], "an expired entry that matched is reported as expired, not unused"


@pytest.mark.parametrize("entry_id", ["PYSEC-2021-108", "CVE-2021-33503", "ghsa-q2q7-5pp4-w6pg"])
def test_any_alias_of_the_advisory_allows_it(tmp_path, entry_id):
    a = allowlist(tmp_path, URLLIB3_OK.format(expires="2026-01-31").replace("CVE-2021-33503", entry_id))
    assert evaluate([urllib3_finding()], a, CELL, TODAY).ok


@pytest.mark.parametrize(
    "change",
    [
        ("CVE-2021-33503", "CVE-2020-26137"),  # another advisory of the same package
        ("package: urllib3", "package: requests"),  # the same advisory, another package
        ("kind: pypi", "kind: deb"),  # the same name in the other world
    ],
)
def test_an_entry_for_something_else_does_not_allow_and_is_unused(tmp_path, change):
    a = allowlist(tmp_path, URLLIB3_OK.format(expires="2026-01-31").replace(*change))
    v = evaluate([urllib3_finding()], a, CELL, TODAY)
    assert not v.ok and v.blocked == [urllib3_finding()]
    assert len(v.unused) == 1 and v.unused[0].startswith("entry #1:")
    assert "matched nothing" in v.message()


def test_package_names_compare_as_pep503_does(tmp_path):
    a = allowlist(tmp_path, URLLIB3_OK.format(expires="2026-01-31").replace("package: urllib3", "package: URLlib3"))
    assert evaluate([urllib3_finding()], a, CELL, TODAY).ok


def test_cells_globs_scope_an_entry(tmp_path):
    a = allowlist(
        tmp_path,
        URLLIB3_OK.format(expires="2026-01-31").replace(
            "kind: pypi", "kind: pypi\n  cells: ['*-ubuntu24.04', 'horovod*']"
        ),
    )
    assert not evaluate([urllib3_finding()], a, CELL, TODAY).ok
    assert evaluate([urllib3_finding()], a, "openmpi5.0.10-cuda12.9-cudnn9-ubuntu24.04", TODAY).ok
    assert evaluate(
        [urllib3_finding()], a, "horovod0.28.1-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12", TODAY
    ).ok
    # Out of scope is not "unused": the entry is for other cells.
    assert evaluate([], a, CELL, TODAY).unused == []
    assert len(evaluate([], a, "openmpi5.0.10-cuda12.9-cudnn9-ubuntu24.04", TODAY).unused) == 1


def test_unused_entry_is_a_warning_not_a_failure(tmp_path):
    v = evaluate([], allowlist(tmp_path, URLLIB3_OK.format(expires="2025-06-30")), CELL, TODAY)
    assert v.ok
    assert v.unused == ["entry #1: CVE-2021-33503 for pypi urllib3, and it expired on 2025-06-30"]
    assert "passed" in v.message() and "warning" in v.message()


def test_one_live_entry_outweighs_an_expired_one_for_another_alias(tmp_path):
    text = URLLIB3_OK.format(expires="2025-01-31") + URLLIB3_OK.format(expires="2026-06-30").replace(
        "CVE-2021-33503", "PYSEC-2021-108"
    )
    v = evaluate([urllib3_finding()], allowlist(tmp_path, text), CELL, TODAY)
    assert v.ok and v.allowed[0][1].id == "PYSEC-2021-108" and v.expired == []


def test_unaudited_fails_under_require_and_passes_loudly_under_warn(tmp_path):
    _, unaudited = pip_audit(
        [Package("pypi", "requests", "2.19.0")],
        runner=recorded_runner((FIX / "pip-audit-unreachable.json").read_text(), returncode=0),
    )
    assert unaudited == [("requests", "Dependency not found on PyPI and could not be audited: requests (2.19.0)")]
    empty = allowlist(tmp_path, "[]")

    required = evaluate([], empty, CELL, TODAY, unaudited=unaudited)
    assert not required.ok
    msg = required.message()
    assert "could not be checked, so the audit FAILS" in msg and "requests: Dependency not found on PyPI" in msg
    assert "vulnerability data could not be reached" in msg and "pip-audit --no-deps --disable-pip" in msg

    warned = evaluate([], empty, CELL, TODAY, unaudited=unaudited, policy="warn")
    assert warned.ok and "could NOT be checked" in warned.message()
    with pytest.raises(ValueError):
        evaluate([], empty, CELL, TODAY, policy="ignore")


def test_warn_policy_does_not_excuse_a_blocked_finding(tmp_path):
    assert not evaluate([urllib3_finding()], allowlist(tmp_path, "[]"), CELL, TODAY, policy="warn").ok


# --- pip-audit ---------------------------------------------------------------------------------


def test_pip_audit_runs_the_pinned_cli_on_pins_of_the_pypi_packages_only():
    run = recorded_runner((FIX / "pip-audit-vulnerable.json").read_text())
    findings, unaudited = pip_audit(planted(), runner=run)
    [(argv, requirements)] = run.calls
    assert argv[1:3] == ["-m", "pip_audit"] and tuple(argv[-len(PIP_AUDIT_FLAGS) :]) == PIP_AUDIT_FLAGS
    assert sorted(requirements.splitlines()) == [
        "PyYAML==6.0.3",
        "requests==2.19.0",
        "torch==2.9.1+cu128",
        "urllib3==1.26.4",
    ]
    assert [(f.package, f.installed, f.fixed, f.ids[0]) for f in findings] == [
        ("urllib3", "1.26.4", "1.26.5", "PYSEC-2021-108"),
        ("requests", "2.19.0", "2.20.0", "PYSEC-2018-28"),
        ("requests", "2.19.0", "2.31.0", "PYSEC-2023-74"),
    ]
    assert findings[0].ids == ("PYSEC-2021-108", "CVE-2021-33503", "GHSA-q2q7-5pp4-w6pg")
    assert findings[0].summary.startswith("An issue was discovered in urllib3 before 1.26.5")
    assert unaudited == [("torch", "Dependency not found on PyPI and could not be audited: torch (2.9.1+cu128)")]


def test_the_pinned_flags_exist_in_the_installed_pip_audit():
    out = subprocess.run(
        [sys.executable, "-m", "pip_audit", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--no-deps", "--disable-pip", "--format", "--progress-spinner"):
        assert flag in out
    pin = [ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if ln.startswith("pip-audit==")]
    version = subprocess.run(
        [sys.executable, "-m", "pip_audit", "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert pin and pin[0].split()[0] == f"pip-audit=={version}"


def test_two_versions_of_one_distribution_go_to_separate_runs():
    run = recorded_runner(json.dumps({"dependencies": [], "fixes": []}), returncode=0)
    pip_audit(
        [Package("pypi", "numpy", "1.26.4"), Package("pypi", "NumPy", "2.1.0"), Package("pypi", "rich", "15.0.0")],
        runner=run,
    )
    runs = sorted(sorted(r.splitlines()) for _, r in run.calls)
    assert len(runs) == 2 and sorted(sum(runs, [])) == ["NumPy==2.1.0", "numpy==1.26.4", "rich==15.0.0"]
    assert all(len({line.split("==")[0].lower() for line in r}) == len(r) for r in runs), runs


def test_a_package_missing_from_the_report_is_unaudited():
    _, unaudited = parse_pip_audit(json.dumps({"dependencies": [], "fixes": []}), [Package("pypi", "rich", "15.0.0")])
    assert unaudited == [("rich", "pip-audit did not report on it")]


def test_a_crashed_pip_audit_leaves_every_package_unaudited():
    stderr = (FIX / "pip-audit-osv-unreachable.stderr").read_text()  # abridged traceback, recorded here
    _, unaudited = pip_audit(
        [Package("pypi", "requests", "2.19.0"), Package("pypi", "rich", "15.0.0")],
        runner=recorded_runner("", returncode=1, stderr=stderr),
    )
    assert [n for n, _ in unaudited] == ["requests", "rich"]
    assert unaudited[0][1].startswith("pip-audit produced no JSON report (exit 1): requests.exceptions.ConnectionError")


def test_a_report_of_an_unknown_shape_is_an_error_not_a_pass():
    with pytest.raises(AuditError, match="no 'dependencies' list"):
        parse_pip_audit('{"results": []}', [])
    with pytest.raises(AuditError, match="unknown shape"):
        parse_pip_audit('{"dependencies": [{"name": "rich", "version": "15.0.0"}]}', [])


def test_the_fix_is_the_first_release_above_the_installed_one():
    report = {
        "dependencies": [
            {
                "name": "urllib3",
                "version": "2.0.0",
                "vulns": [
                    {"id": "GHSA-v845-jxx5-vc9f", "fix_versions": ["1.26.18", "2.0.7"], "aliases": ["CVE-2023-43804"]}
                ],
            }
        ]
    }
    [finding], _ = parse_pip_audit(json.dumps(report), [Package("pypi", "urllib3", "2.0.0")])
    assert finding.fixed == "2.0.7" and finding.summary == ""


def test_no_pypi_packages_runs_nothing():
    run = recorded_runner("never read")
    assert pip_audit([Package("deb", "libssl3", "3.0.15-1~deb12u1")], runner=run) == ([], [])
    assert run.calls == []


# --- apt ---------------------------------------------------------------------------------------


def test_debian12_security_upgrades_only():
    findings = apt_security_findings((FIX / "apt-debian12.txt").read_text())
    assert [(f.package, f.installed, f.fixed) for f in findings] == [
        ("libssl3", "3.0.15-1~deb12u1", "3.0.17-1~deb12u2"),
        ("openssl", "3.0.15-1~deb12u1", "3.0.17-1~deb12u2"),
        ("libsystemd0", "252.33-1~deb12u1", "252.39-1~deb12u1"),
    ]  # in stable AND stable-security
    assert {f.kind for f in findings} == {"deb"} and all(f.ids == () for f in findings)
    assert findings[0].summary == "Debian-Security:12/stable-security"


def test_ubuntu2404_security_upgrades_only():
    findings = apt_security_findings((FIX / "apt-ubuntu2404.txt").read_text())
    assert [(f.package, f.fixed) for f in findings] == [
        ("libpam0g", "1.5.3-5ubuntu5.4"),
        ("libpam-modules", "1.5.3-5ubuntu5.4"),
        ("libssl3t64", "3.0.13-0ubuntu3.5"),
        ("openssl", "3.0.13-0ubuntu3.5"),
    ]
    assert findings[0].summary == "Ubuntu:24.04/noble-security"


def test_a_deb_finding_blocks_the_cell_with_what_to_do(tmp_path):
    findings = apt_security_findings((FIX / "apt-debian12.txt").read_text())
    msg = evaluate(findings, allowlist(tmp_path, "[]"), CELL, TODAY).message()
    assert "deb libssl3 3.0.15-1~deb12u1 -> 3.0.17-1~deb12u2 (no advisory id known)" in msg
    assert "rebuild" in msg


def test_no_security_suite_means_a_blind_audit_not_a_clean_one():
    regular_only = "\n".join(
        ln for ln in (FIX / "apt-debian12.txt").read_text().splitlines() if "security" not in ln.lower()
    )
    with pytest.raises(AuditError, match="no security suite"):
        apt_security_findings(regular_only)
    assert apt_security_findings(regular_only, require_security_source=False) == []


def test_nothing_pending_with_a_security_suite_is_clean():
    text = (FIX / "apt-debian12.txt").read_text()
    policy_only = (
        text[: text.index("Pinned packages:")] + "0 upgraded, 0 newly installed, 0 to remove and 0 not upgraded.\n"
    )
    assert apt_security_findings(policy_only) == []


def test_an_unreadable_inst_line_is_an_error():
    with pytest.raises(AuditError, match="unreadable line"):
        apt_security_findings("Inst libssl3 3.0.15 3.0.17\n", require_security_source=False)


def test_the_apt_command_simulates_and_never_installs():
    assert "apt-get -s -o Debug::NoLocking=1 dist-upgrade" in APT_SECURITY_COMMAND
    assert "apt-cache policy" in APT_SECURITY_COMMAND and "apt-get update" in APT_SECURITY_COMMAND
    for verb in ("install", "apt-get upgrade", "apt-get -y", "dpkg -i"):
        assert verb not in APT_SECURITY_COMMAND
