"""Every rendered Dockerfile passes hadolint with no error (and, today, no warning).
Ignored rules are justified in .hadolint.yaml."""

import json
import subprocess

from trainbase.render import hadolint

from .conftest import ROOT


def test_hadolint_is_clean_on_every_rendered_dockerfile(capsys):
    dockerfiles = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "images").glob("*/Dockerfile"))
    assert len(dockerfiles) >= 24
    assert hadolint.run(dockerfiles, ROOT) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary == f"hadolint: {len(dockerfiles)} Dockerfile(s), 0 error(s), 0 warning(s)"


def test_hadolint_really_reports_errors(tmp_path):
    """The lint can fail: a Dockerfile with a known error is reported as one."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:12.15-slim\nRUN cd /tmp && apt-get install curl\nMAINTAINER someone\n")
    proc = subprocess.run(
        [
            hadolint.hadolint_binary(),
            "--config",
            str(ROOT / ".hadolint.yaml"),
            "--format",
            "json",
            "--no-fail",
            str(bad),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert "DL4000" in codes  # MAINTAINER is deprecated (error level)
    assert hadolint.run([str(bad)], ROOT) == 1
