"""Mirrors (trainbase/deliver/mirror.py): which registries need a repository before a push,
and ECR's creation through the aws CLI (a fake runner records the calls; the copy itself runs
for real against the loopback registry in tests/build/test_registry_side.py)."""
import io
import subprocess

import pytest

from trainbase.deliver import mirror
from trainbase.errors import TrainbaseError

ECR = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"


def test_each_registry_kind_is_recognised():
    assert [mirror.kind(h) for h in ("ghcr.io", "myacr.azurecr.io", ECR, "docker.io", "127.0.0.1:5000")] == \
        ["ghcr", "acr", "ecr", "dockerhub", "other"]


def _runner(answers):
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        rc, err = answers.pop(0)
        return subprocess.CompletedProcess(cmd, rc, "", err)
    return run, calls


def test_ecr_repositories_are_created_when_missing_and_left_when_present():
    run, calls = _runner([(254, "An error occurred (RepositoryNotFoundException) when calling ..."), (0, "")])
    out = io.StringIO()
    mirror.ensure_repository(ECR, "trainbase/cellx", out, run)
    assert calls[0][-3:] == ["describe-repositories", "--repository-names", "trainbase/cellx"]
    assert "create-repository" in calls[1] and "scanOnPush=true" in calls[1] and "--region" in calls[1]
    assert calls[1][calls[1].index("--region") + 1] == "eu-west-1"
    assert "created ECR repository" in out.getvalue()
    run, calls = _runner([(0, "")])
    mirror.ensure_repository(ECR, "trainbase/cellx", io.StringIO(), run)
    assert len(calls) == 1
    run, calls = _runner([])
    mirror.ensure_repository("myacr.azurecr.io", "trainbase/cellx", io.StringIO(), run)   # ACR creates on push
    assert calls == []


def test_an_ecr_answer_that_is_not_not_found_stops_the_mirror():
    run, _ = _runner([(255, "An error occurred (AccessDeniedException): not authorized")])
    with pytest.raises(TrainbaseError, match="cannot say whether trainbase/cellx exists.*AccessDenied"):
        mirror.ensure_repository(ECR, "trainbase/cellx", io.StringIO(), run)


def test_mirrors_come_from_the_command_line_or_the_repository_variable(monkeypatch, capsys):
    monkeypatch.delenv("TRAINBASE_MIRRORS", raising=False)
    assert mirror.main(["--from", "ghcr.io/org/trainbase"]) == 0
    assert "no mirror configured" in capsys.readouterr().out
    monkeypatch.setenv("TRAINBASE_MIRRORS", '[{"registry": "myacr.azurecr.io/trainbase"}, {"registry": "docker.io/org"}]')
    assert mirror.mirrors_from_env() == ["myacr.azurecr.io/trainbase", "docker.io/org"]
    monkeypatch.setenv("TRAINBASE_MIRRORS", '["myacr.azurecr.io"]')
    with pytest.raises(TrainbaseError, match="TRAINBASE_MIRRORS"):
        mirror.mirrors_from_env()


def _mirror_password_expressions() -> list[str]:
    import yaml
    from .conftest import ROOT
    job = yaml.safe_load((ROOT / ".github/workflows/gpu.yml").read_text())["jobs"]["mirror"]
    found = []
    for step in job["steps"]:
        for where in (step.get("with") or {}, step.get("env") or {}):
            for key, value in where.items():
                if key.lower() == "password" and "secrets.TRAINBASE_MIRROR_" in str(value):
                    found.append(" ".join(str(value).split()))
    return found


def test_a_mirror_gets_only_its_own_kind_s_secret():
    """Issue 39: a missing ACR password fell through to the GHCR token, which was then sent to
    Azure. Every term of each password expression is guarded by its kind, and the last default
    is empty (the credential check step then fails, naming the secret)."""
    exprs = _mirror_password_expressions()
    assert len(exprs) == 2, exprs      # the check step and the login
    for e in exprs:
        terms = [t.strip(" ${}") for t in e.split("||")]
        assert terms[-1] == "''", f"the last default must be empty, not another secret: {e}"
        for t in terms[:-1]:
            assert t.startswith("matrix.mirror.kind == '") and "&& secrets.TRAINBASE_MIRROR_" in t, \
                f"an unguarded secret in a mirror's password: {t!r} in {e}"
