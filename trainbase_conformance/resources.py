"""Files the checks copy into containers or validate against, found the same way in a checkout
and in the installed wheel: the probes live in the package; the doctor's JSON schema and the
example training scripts are published from the repository's docs/ and examples/, so the wheel
carries copies of them under ``data/`` (packaging/conformance/pyproject.toml) and a checkout
reads the originals."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CHECKS = PACKAGE / "checks"
PROBES = PACKAGE / "probes"
EXPECTATIONS_SCHEMA = PACKAGE / "expectations.schema.json"
RUNNER_SCHEMA = PACKAGE / "runner.schema.json"  # the runner's fabric and bandwidth floors (floors.py)


def _shipped(name: str, in_checkout: str) -> Path:
    packaged = PACKAGE / "data" / name
    return packaged if packaged.exists() else PACKAGE.parent / in_checkout


DOCTOR_SCHEMA = _shipped("doctor.schema.json", "docs/doctor.schema.json")
EXAMPLES = _shipped("examples", "examples")
