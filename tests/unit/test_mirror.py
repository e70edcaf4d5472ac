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
    assert [mirror.kind(h) for h in ("ghcr.io", "myacr.azurecr.io", ECR, "docker.io", "127.0.0.1:5000")] == [
        "ghcr",
        "acr",
        "ecr",
        "dockerhub",
        "other",
    ]


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
    mirror.ensure_repository("myacr.azurecr.io", "trainbase/cellx", io.StringIO(), run)  # ACR creates on push
    assert calls == []


def test_an_ecr_answer_that_is_not_not_found_stops_the_mirror():
    run, _ = _runner([(255, "An error occurred (AccessDeniedException): not authorized")])
    with pytest.raises(TrainbaseError, match="cannot say whether trainbase/cellx exists.*AccessDenied"):
        mirror.ensure_repository(ECR, "trainbase/cellx", io.StringIO(), run)


def test_mirrors_come_from_the_command_line_or_the_repository_variable(monkeypatch, capsys):
    monkeypatch.delenv("TRAINBASE_MIRRORS", raising=False)
    assert mirror.main(["--from", "ghcr.io/org/trainbase"]) == 0
    assert "no mirror configured" in capsys.readouterr().out
    monkeypatch.setenv(
        "TRAINBASE_MIRRORS", '[{"registry": "myacr.azurecr.io/trainbase"}, {"registry": "docker.io/org"}]'
    )
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
    assert len(exprs) == 2, exprs  # the check step and the login
    for e in exprs:
        terms = [t.strip(" ${}") for t in e.split("||")]
        assert terms[-1] == "''", f"the last default must be empty, not another secret: {e}"
        for t in terms[:-1]:
            assert t.startswith("matrix.mirror.kind == '") and "&& secrets.TRAINBASE_MIRROR_" in t, (
                f"an unguarded secret in a mirror's password: {t!r} in {e}"
            )


# -- issue 52 (10): the mirror goes on, mirrors the zstd twin, and keeps each login --------------------
def test_ecr_repositories_are_created_with_immutable_release_tags():
    """Tags were created MUTABLE: a mirror key could overwrite a release tag. Only the aliases
    promotion moves stay movable."""
    run, calls = _runner([(254, "RepositoryNotFoundException"), (0, "")])
    mirror.ensure_repository(ECR, "trainbase/cellx", io.StringIO(), run)
    create = calls[1]
    assert create[create.index("--image-tag-mutability") + 1] == "IMMUTABLE_WITH_EXCLUSION"
    assert "MUTABLE" not in create
    assert create[create.index("--image-tag-mutability-exclusion-filters") + 1] == "filterType=WILDCARD,filter=latest*"


def test_the_mirror_goes_on_past_a_broken_repository_and_reports_each_one():
    """mirror.py stopped at the first broken repository (one try around the whole loop)."""
    done = []

    def one(dst, repo, tag):
        if repo in ("b", "d"):
            raise TrainbaseError(f"registry refused {repo}")
        done.append((dst, repo))
        return "latest -> sha256:..."

    out = io.StringIO()
    failures = mirror.mirror_all(
        "ghcr.io/o/tb",
        ["acr.azurecr.io/tb", "docker.io/o"],
        {"a": "r1", "b": "r2", "c": "r3", "d": "r4", "e": None},
        out,
        one,
    )
    assert done == [(m, r) for m in ("acr.azurecr.io/tb", "docker.io/o") for r in ("a", "c")]
    assert failures == [f"{m}/{r}" for m in ("acr.azurecr.io/tb", "docker.io/o") for r in ("b", "d", "e")] or [
        f.split(":")[0] for f in failures
    ] == [f"{m}/{r}" for m in ("acr.azurecr.io/tb", "docker.io/o") for r in ("b", "d", "e")]
    assert "acr.azurecr.io/tb/b: FAILED: registry refused b" in out.getvalue()


class _Refs:
    """A referrers client with nothing attached (the attestation copy is tested on the loopback registry)."""

    def descriptor(self, repo, ref):
        from trainbase.deliver import referrers

        return referrers.Descriptor(referrers.OCI_MANIFEST, ref, 1)

    def copy_referrers(self, *a, **kw):
        return 0


def test_the_zstd_twin_is_mirrored_with_its_own_alias_and_each_side_keeps_its_login(monkeypatch, tmp_path):
    """`-zstd` tags were never mirrored; and a mirror on the primary's host (kind: ghcr) logged
    in over the primary's credentials: each side now reads its own DOCKER_CONFIG."""
    import os

    from trainbase.deliver import registry

    src_cfg, dst_cfg = tmp_path / "primary", tmp_path / "mirror"
    tags = {
        "ghcr.io/o/tb/base:latest": "sha256:1",
        "ghcr.io/o/tb/base:r1": "sha256:1",
        "ghcr.io/o/tb/base:latest-zstd": "sha256:2",
        "ghcr.io/o/tb/base:r1-zstd": "sha256:2",
    }
    asked_with = []

    def digest(host, repo, tag):
        asked_with.append((host, os.environ.get("DOCKER_CONFIG")))
        return tags.get(f"{host}/{repo}:{tag}")

    copies = []

    def retag(src, dst, src_config=None, dst_config=None):
        copies.append((src, dst, src_config, dst_config))
        tags[dst] = src.split("@")[1]

    monkeypatch.setattr(registry, "digest", digest)
    monkeypatch.setattr(registry, "retag", retag)
    clients = {f"ghcr.io {src_cfg}": _Refs(), f"ghcr.io {dst_cfg}": _Refs()}
    done = mirror.mirror_one(
        "ghcr.io/o/tb",
        "ghcr.io/mirror/tb",
        "base",
        "r1",
        io.StringIO(),
        clients=clients,
        src_config=src_cfg,
        dst_config=dst_cfg,
    )
    assert (
        tags["ghcr.io/mirror/tb/base:r1-zstd"] == "sha256:2"
        and tags["ghcr.io/mirror/tb/base:latest-zstd"] == "sha256:2"
    )
    assert tags["ghcr.io/mirror/tb/base:latest"] == "sha256:1" and "latest-zstd -> sha256:2" in done
    assert copies[0] == ("ghcr.io/o/tb/base@sha256:1", "ghcr.io/mirror/tb/base:r1", src_cfg, dst_cfg)
    # every question about the primary with the primary's login, about the mirror with the mirror's
    assert {cfg for host, cfg in asked_with} == {str(src_cfg), str(dst_cfg)}
    asked_with.clear()
    mirror.mirror_one(
        "ghcr.io/o/tb",
        "ghcr.io/mirror/tb",
        "base",
        "r1",
        io.StringIO(),
        clients=clients,
        src_config=src_cfg,
        dst_config=dst_cfg,
    )
    assert len(copies) == 4  # second run: already current


def test_the_mirror_job_logs_in_to_the_mirror_in_its_own_docker_config():
    """`kind: ghcr`'s login overwrote the primary's (one config.json, one login per host)."""
    import yaml

    from .conftest import ROOT

    steps = yaml.safe_load((ROOT / ".github/workflows/gpu.yml").read_text())["jobs"]["mirror"]["steps"]
    login = next(s for s in steps if s.get("id") == "mirror")
    copy = steps[-1]
    assert login["env"]["DOCKER_CONFIG"] == "${{ runner.temp }}/mirror-docker-config"
    assert '--to-config "$RUNNER_TEMP/mirror-docker-config"' in copy["run"]
    primary = next(s for s in steps if s.get("id") == "registry")
    assert "DOCKER_CONFIG" not in (primary.get("env") or {})
