"""Refused platforms are left out the same way everywhere (trainbase/deliver/platforms.py,
``publishable``): the CI plan never builds a refused cell (an artifact whose checksum is
pending: the Ubuntu arm64 twins while Miniforge's aarch64 sha256 was), so its repository is
published under the tag over the platforms that ARE built -- and that is the tag promotion,
the index merge, the mirrors and the attestation check look for. Before, those four grouped
every selected cell, refused ones included: promotion looked for a tag nobody published, said
"not published" and exited 0, the merge looked for a staged arm64 image and failed.

All against a scratch copy of the real matrix.yaml with that checksum set back to pending (the
fixture ``root``) and a fake registry."""

import io
import json
from pathlib import Path

import pytest

from trainbase.define.matrix import load
from trainbase.deliver import attest, mirror, platforms, promote, registry
from trainbase.deliver.publish import release_tag
from trainbase.render import recipes
from trainbase.supply import vulnscan

from ..conftest import copy_inputs, pend_miniforge_arm64
from .conftest import run_cli

REGISTRY = "reg.example:5000/tb"
EXAMPLE = "openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"  # its twin is refused in the scratch checkout (root)


def outputs(text: str) -> dict:
    """`KEY=JSON` lines -> dict, as GitHub reads $GITHUB_OUTPUT."""
    return {k: json.loads(v) for k, v in (line.split("=", 1) for line in text.splitlines())}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A scratch checkout whose Ubuntu arm64 twins are refused (Miniforge's aarch64 checksum set
    back to pending: pend_miniforge_arm64), rendered: the real matrix refuses no platform now."""
    from trainbase.cli.main import main

    scratch = copy_inputs(tmp_path_factory.mktemp("publishable"))
    pend_miniforge_arm64(scratch / "matrix.yaml")
    assert main(["render", "--file", str(scratch / "matrix.yaml")]) == 0
    return scratch


@pytest.fixture(scope="module")
def pair(root) -> tuple[str, str]:
    """(a base repository of the production profile, its arm64 twin the CI plan refuses), as
    build.yml's plan reports it (``left_out``): EXAMPLE."""
    from trainbase.cli.main import main

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", out)
        assert main(["ci-matrix", "--profile", "production", "--file", str(root / "matrix.yaml")]) == 0
    plan = outputs(out.getvalue())
    bases = {e["name"] for e in plan["cells"] if e["level"] == 0}
    pairs = sorted((n.removesuffix("-arm64"), n) for n in plan["left_out"] if n.removesuffix("-arm64") in bases)
    assert (EXAMPLE, f"{EXAMPLE}-arm64") in pairs, plan["left_out"]
    return EXAMPLE, f"{EXAMPLE}-arm64"


class Registry:
    """registry.digest / retag / tag_state, with what was asked for."""

    def __init__(self):
        self.manifests: dict[str, str] = {}
        self.asked: list[str] = []
        self.retags: list[tuple[str, str]] = []

    def digest(self, host, repo, tag):
        self.asked.append(f"{host}/{repo}:{tag}")
        return self.manifests.get(f"{host}/{repo}:{tag}")

    def retag(self, src, dst):
        self.retags.append((src, dst))
        self.manifests[dst] = src.split("@")[1]

    def tag_state(self, host, repo, tag):
        return "present" if self.digest(host, repo, tag) else "absent"


@pytest.fixture
def reg(monkeypatch):
    r = Registry()
    for name in ("digest", "retag", "tag_state"):
        monkeypatch.setattr(registry, name, getattr(r, name))
    monkeypatch.setattr(registry, "push_index", lambda *a: pytest.fail(f"an index was pushed: {a}"))
    # the attestations' verification is test_delivery's and the loopback registry's (issue 52)
    monkeypatch.setattr(attest, "attestation_check", lambda key, github_repo="": lambda ref: [])
    return r


@pytest.fixture(scope="module")
def matrix(root):
    return load(root / "matrix.yaml")


def ci_plan(capsys, root: Path, *names) -> dict:
    """What `build.py --ci-matrix` (build.yml's plan) says about the named cells."""
    code, out, _ = run_cli(
        ["ci-matrix", "--file", str(root / "matrix.yaml"), "--select", f"name={','.join(names)}"], capsys
    )
    assert code == 0
    return outputs(out)


def test_the_twin_is_refused_and_the_plan_publishes_the_repository_under_its_amd64_tag(pair, root, matrix, capsys):
    repo, twin = pair
    plan = ci_plan(capsys, root, repo, twin)
    assert [e["name"] for e in plan["cells"]] == [repo] and "no verified sha256" in plan["left_out"][twin]
    rendered = recipes.render_all(matrix, [matrix.cell(repo), matrix.cell(twin)], root=root)
    assert (
        plan["cells"][0]["release_tag"] == rendered[repo].tag != release_tag([rendered[repo].tag, rendered[twin].tag])
    )
    [release] = platforms.publishable(matrix, rendered, [matrix.cell(repo), matrix.cell(twin)]).values()
    assert (
        release.tag == rendered[repo].tag and release.platforms == {"linux/amd64"} and list(release.left_out) == [twin]
    )


def test_promote_looks_for_the_tag_the_ci_plan_publishes(pair, root, reg, matrix, capsys):
    """The old behaviour: promote asked for release_tag(amd64, arm64), found nothing, printed
    "not published" and exited 0 -- latest never moved for this repository."""
    repo, twin = pair
    tag = ci_plan(capsys, root, repo, twin)["cells"][0]["release_tag"]
    reg.manifests[f"{REGISTRY}/{repo}:{tag}"] = "sha256:" + "1" * 64  # what build.yml published
    out = io.StringIO()
    code = promote.command(matrix, root, [matrix.cell(repo), matrix.cell(twin)], REGISTRY, None, out)
    assert f"{REGISTRY}/{repo}:{tag}" in reg.asked
    assert code == 0, out.getvalue()
    assert reg.manifests[f"{REGISTRY}/{repo}:latest"] == "sha256:" + "1" * 64
    assert f"promote: {repo}: left out: {twin}: artifact" in out.getvalue()


def test_promote_requires_the_gpu_tier_only_on_the_platforms_that_are_published(pair, root, matrix):
    repo, twin = pair
    rendered = recipes.render_all(matrix, [matrix.cell(repo), matrix.cell(twin)], root=root)
    [release] = platforms.publishable(matrix, rendered, [matrix.cell(repo), matrix.cell(twin)]).values()
    assert promote.required_checks(release.platforms) == ("gpu[linux/amd64]", vulnscan.CHECK)


def test_a_repository_whose_tag_is_missing_fails_the_promotion_naming_it(pair, root, reg, matrix):
    """Before, "not published" was a line among others and exit 0: a build that never published
    left the run green."""
    repo, twin = pair
    other = next(
        c
        for c in matrix.select(profile="production")
        if c.parent is None and c.name not in (repo, twin) and c.platform == "linux/amd64" and c.image != repo
    )
    tags = {
        r.repository: r.tag
        for r in platforms.publishable(
            matrix, recipes.render_all(matrix, [matrix.cell(repo), other], root=root), [matrix.cell(repo), other]
        ).values()
    }
    reg.manifests[f"{REGISTRY}/{repo}:{tags[repo]}"] = "sha256:" + "2" * 64  # the other one is not published
    out = io.StringIO()
    code = promote.command(matrix, root, [matrix.cell(repo), other], REGISTRY, None, out)
    assert code == 1
    assert reg.manifests[f"{REGISTRY}/{repo}:latest"] == "sha256:" + "2" * 64  # the published one still moves
    assert f"{other.name}: {REGISTRY}/{other.image}:{tags[other.image]} is not published" in out.getvalue()
    assert f"cannot be promoted, no published release tag (see above): {other.image}\n" in out.getvalue()


def test_a_repository_with_nothing_publishable_fails_the_promotion_naming_it(pair, root, reg, matrix):
    repo, twin = pair
    out = io.StringIO()
    code = promote.command(matrix, root, [matrix.cell(twin)], REGISTRY, None, out)
    assert code == 1 and reg.retags == [] and reg.asked == []
    assert f"promote: {repo}: NOTHING can be published: {twin}: artifact" in out.getvalue()
    assert f"cannot be promoted, no published release tag (see above): {repo}\n" in out.getvalue()


def test_merge_leaves_the_refused_twin_out_instead_of_failing_on_it(pair, root, reg, matrix):
    """The old merge grouped both cells, found neither staged (the amd64 image was published as
    it is, its twin never built) and failed the job: "no staged image for linux/amd64, linux/arm64"."""
    repo, twin = pair
    out = io.StringIO()
    code = platforms.merge_command(matrix, root, [matrix.cell(repo), matrix.cell(twin)], REGISTRY, out=out)
    assert code == 0, out.getvalue()
    assert f"merge: {repo}: left out, never built: {twin}: artifact" in out.getvalue()
    assert "NOT published" not in out.getvalue()


def test_mirror_copies_the_release_tag_the_ci_plan_publishes(pair, root, reg, matrix, monkeypatch, capsys):
    repo, twin = pair
    tag = ci_plan(capsys, root, repo, twin)["cells"][0]["release_tag"]
    copied = []
    monkeypatch.setattr(
        mirror, "mirror_one", lambda src, dst, name, t, out, clients=None, **kw: copied.append((name, t)) or "ok"
    )
    assert (
        mirror.main(
            [
                "--from",
                REGISTRY,
                "--to",
                "mirror.example/tb",
                "--file",
                str(root / "matrix.yaml"),
                "--select",
                f"name={repo},{twin}",
            ]
        )
        == 0
    )
    assert copied == [(repo, tag)]
    copied.clear()
    assert (
        mirror.main(
            [
                "--from",
                REGISTRY,
                "--to",
                "mirror.example/tb",
                "--file",
                str(root / "matrix.yaml"),
                "--select",
                f"name={twin}",
            ]
        )
        == 1
    )
    assert copied == [] and f"{repo}: NOT mirrored: nothing of it can be published" in capsys.readouterr().out


def test_attestations_are_checked_on_the_published_tag_and_platforms_only(pair, root, matrix, monkeypatch, capsys):
    repo, twin = pair
    tag = ci_plan(capsys, root, repo, twin)["cells"][0]["release_tag"]
    checked = []
    monkeypatch.setattr(attest.att, "load_public_key", lambda path: "key")
    monkeypatch.setattr(attest.referrers, "Client", lambda host: host)
    monkeypatch.setattr(
        attest,
        "verify_ref",
        lambda client, name, ref, platform, key, out: checked.append((name, ref, platform)) or True,
    )
    out = io.StringIO()
    code = attest.verify_command(matrix, root, [matrix.cell(repo), matrix.cell(twin)], "", REGISTRY, "key.pem", out)
    assert code == 0 and checked == [(f"tb/{repo}", tag, "linux/amd64")]
    assert f"verify: {repo}: never published, not verified: {twin}" in out.getvalue()
