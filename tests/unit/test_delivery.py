"""The delivery logic without CI: the job matrix `build.py --ci-matrix` generates from a given
matrix.yaml (levels, a new CUDA version, refused cells, the pull-request subset, the registry
filter), and the publishing rules against a fake registry: an immutable tag is never
overwritten or deleted, the moving alias follows it."""

import io
import json
import re
from dataclasses import dataclass, field

import pytest
import yaml

from trainbase.define.matrix import load
from trainbase.deliver import ci_matrix, publish, registry
from trainbase_common import engine
from trainbase_common.states import JobState

from .conftest import ROOT, run_cli
from .test_affected import add_cuda


def outputs(text: str) -> dict:
    """`KEY=JSON` lines -> dict, as GitHub reads $GITHUB_OUTPUT."""
    return {k: json.loads(v) for k, v in (line.split("=", 1) for line in text.splitlines())}


def ci(args: list[str], capsys, matrix_file=ROOT / "matrix.yaml") -> tuple[int, dict, str]:
    code, out, err = run_cli(["ci-matrix", "--file", str(matrix_file), *args], capsys)
    return code, (outputs(out) if code == 0 else {}), err


def test_levels_put_every_parent_one_level_below_its_child(capsys):
    code, o, _ = ci(["--profile", "production"], capsys)
    m = load(ROOT / "matrix.yaml")
    # every production cell is fanned out: the arm64 Ubuntu cells, once left out for Miniforge's
    # aarch64 checksum, have it pinned (issue 71)
    assert code == 0 and o["count"] == len(o["cells"])
    assert o["count"] + len(o["left_out"]) == len(m.select(profile="production"))
    assert not o["left_out"], o["left_out"]
    where = {e["name"]: i for i in range(o["depth"]) for e in o[f"level{i}"]}
    assert sorted(where) == sorted(e["name"] for e in o["cells"])
    for name, level in where.items():
        parent = m.cell(name).parent
        assert (level == 0) if parent is None else (where[parent] == level - 1)
    e = o["cells"][0]
    assert re.fullmatch(r"r[0-9a-f]{12}", e["tag"]) and e["image"] == f"trainbase/{e['name']}:{e['tag']}"


def test_a_new_cuda_version_reaches_the_ci_matrix_with_no_workflow_edit(workdir, capsys):
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    add_cuda(data, "13.3", like="13.2")
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, o, _ = ci(["--profile", "production", "--max-levels", "3"], capsys, workdir / "matrix.yaml")
    assert code == 0
    new = {lv: [e["name"] for e in o[f"level{lv}"] if "-cuda13.3-" in e["name"]] for lv in range(3)}
    assert new[0] and new[1] and new[2]  # base, PyTorch 2.15 on it, DeepSpeed on that
    assert any(n.startswith("pytorch2.15.0-") for n in new[1])
    # and nothing in .github names a CUDA version or a cell: there is nothing to edit there
    from .test_delivery_workflows import workflow_texts

    for path, text in workflow_texts().items():
        assert not re.search(r"cuda\d|openmpi\d|intelmpi\d|pytorch\d", text), path


def test_more_levels_than_the_workflow_declares_fail_the_plan_naming_the_fix(capsys):
    code, _, err = ci(["--profile", "production", "--max-levels", "2"], capsys)
    assert code == 1 and "3 FROM levels" in err and "add a build-level2 job" in err


def test_max_levels_pads_empty_levels_so_every_declared_job_has_an_output(capsys):
    code, o, _ = ci(["--profile", "ci", "--max-levels", "3"], capsys)
    # the ci profile: bases (level 0) and one framework on them (level 1); level 2 is padding
    assert code == 0 and o["depth"] == 2 and o["level1"] and o["level2"] == []


def test_cells_with_an_unverified_artifact_are_left_out_with_the_reason(workdir, capsys):
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    data["artifacts"]["horovod-0.28.1-sdist"]["sha256"] = "pending"
    data["artifacts"]["horovod-0.28.1-sdist"]["pending_reason"] = "upstream re-tagged the release"
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, o, _ = ci(["--select", "os=debian12"], capsys, workdir / "matrix.yaml")
    assert code == 0
    assert o["left_out"] and all(n.startswith("horovod") for n in o["left_out"])
    assert all("no verified sha256 (upstream re-tagged" in why for why in o["left_out"].values())
    assert not any(e["name"].startswith("horovod") for e in o["cells"])
    # the pull-request subset is chosen among the buildable cells, so it still covers the rest
    code, o, _ = ci(["--select", "os=debian12", "--cover"], capsys, workdir / "matrix.yaml")
    m = load(workdir / "matrix.yaml")
    built = set().union(*(ci_matrix.chain_values(m, m.cell(e["name"])) for e in o["cells"]))
    assert {v for axis, v in built if axis == "framework"} == {"none", "pytorch", "tensorflow", "deepspeed", "te"}


def test_the_pull_request_subset_covers_every_axis_value_of_the_affected_cells():
    m = load(ROOT / "matrix.yaml")
    cells = m.included
    chosen = ci_matrix.cover(m, cells)
    every = set().union(*(ci_matrix.chain_values(m, c) for c in cells))
    assert set().union(*(ci_matrix.chain_values(m, c) for c in chosen)) == every
    assert len(chosen) <= len(every) and len(chosen) < len(cells) / 4
    assert any(c.framework == "none" for c in chosen)  # a base image is tested itself too


def test_the_subset_of_a_new_cuda_version_tests_it(workdir):
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    add_cuda(data, "13.3", like="13.2")
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    m = load(workdir / "matrix.yaml")
    chosen = ci_matrix.cover(m, [c for c in m.included if c.cuda == "13.3"])
    assert chosen and {c.cuda for c in chosen} == {"13.3"}
    assert {c.os for c in chosen} == {c.os for c in m.included if c.cuda == "13.3"}


def test_the_registry_filter_keeps_published_cells_by_digest_or_unpublished_ones():
    items = [
        {"name": "a", "level": 0, "tag": "r000000000001", "image": "trainbase/a:r000000000001"},
        {"name": "b", "level": 1, "tag": "r000000000002", "image": "trainbase/b:r000000000002"},
    ]
    asked = []

    def digest(host, repo, tag):
        asked.append((host, repo, tag))
        return "sha256:" + "1" * 64 if repo.endswith("/a") else None

    pub, left = ci_matrix.with_registry_state(items, "ghcr.io/acme/trainbase", "published", digest)
    assert [e["ref"] for e in pub] == ["ghcr.io/acme/trainbase/a@sha256:" + "1" * 64] and left == {"b": "not published"}
    assert asked[0] == ("ghcr.io", "acme/trainbase/a", "r000000000001")
    unpub, left = ci_matrix.with_registry_state(items, "ghcr.io/acme/trainbase", "unpublished", digest)
    assert [e["name"] for e in unpub] == ["b"] and "ref" not in unpub[0] and left == {"a": "published"}


def test_only_needs_a_registry(capsys):
    code, _, err = ci(["--profile", "ci", "--only", "published"], capsys)
    assert code == 2 and "--only needs --registry" in err


# -- publishing rules, against a fake registry -----------------------------------------------------
class FakeRegistry:
    """A registry behind the engine adapter: manifests by reference; a push of an immutable tag
    that exists is recorded as a violation (a real registry would silently overwrite it)."""

    def __init__(self):
        self.manifests: dict[str, str] = {}
        self.local: dict[str, str] = {}  # engine: ref -> content id
        self.pushes: list[str] = []
        self.overwrites: list[str] = []
        self.refuse = False

    def distribution_digest(self, ref):
        if self.refuse:
            raise engine.EngineAPIError(401, "unauthorized: authentication required")
        if ref not in self.manifests:
            raise engine.EngineAPIError(404, f"manifest unknown: {ref}")
        return self.manifests[ref]

    def push(self, ref):
        if re.search(r":r[0-9a-f]{12}$", ref) and ref in self.manifests:
            self.overwrites.append(ref)
        self.manifests[ref] = "sha256:" + self.local[ref].rjust(64, "0")
        self.pushes.append(ref)
        return self.manifests[ref]

    def tag_local(self, src, dst):
        self.local[dst] = self.local[src]


@dataclass
class FakeJob:
    name: str
    tag: str
    parent: str | None = None
    status: JobState = JobState.BUILT
    pushed: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    repo_digest: str | None = None
    platform: str = "linux/amd64"
    repo: str | None = None  # the published repository, when not the name (arm64 cells)

    @property
    def image(self):
        return f"trainbase/{self.name}:{self.tag}"

    @property
    def repository(self):
        return self.repo or self.name


@pytest.fixture
def reg(monkeypatch):
    r = FakeRegistry()
    monkeypatch.setattr(engine, "distribution_digest", r.distribution_digest)
    monkeypatch.setattr(engine, "push", r.push)
    return r


def publish_jobs(reg, jobs):
    for j in jobs:
        reg.local.setdefault(j.image, f"{j.name}{j.tag}".encode().hex()[:12])
    return publish.publish(jobs, "reg.example:5000/tb", reg.tag_local, out=io.StringIO())


def test_only_immutable_tags_are_pushed_parents_first(reg):
    """Publishing stages: the alias is promotion's (registry side, by digest, after the gate)."""
    jobs = [FakeJob("base", "r" + "a" * 12), FakeJob("torch", "r" + "b" * 12, parent="base")]
    assert publish_jobs(reg, jobs) == 2
    assert reg.pushes == ["reg.example:5000/tb/base:r" + "a" * 12, "reg.example:5000/tb/torch:r" + "b" * 12]


def test_an_immutable_tag_is_never_overwritten(reg):
    tag = "r" + "c" * 12
    reg.manifests[f"reg.example:5000/tb/base:{tag}"] = "sha256:" + "9" * 64  # published by another runner
    job = FakeJob("base", tag)
    assert publish_jobs(reg, [job]) == 1
    assert reg.overwrites == [] and reg.manifests[f"reg.example:5000/tb/base:{tag}"] == "sha256:" + "9" * 64
    assert reg.pushes == []
    publish_jobs(reg, [job])  # and again: still untouched
    assert reg.overwrites == []


def test_a_new_recipe_adds_a_tag_and_keeps_every_older_one(reg):
    old, new = FakeJob("base", "r" + "1" * 12), FakeJob("base", "r" + "2" * 12)
    publish_jobs(reg, [old])
    old_digest = reg.manifests["reg.example:5000/tb/base:r" + "1" * 12]
    publish_jobs(reg, [new])
    assert reg.manifests["reg.example:5000/tb/base:r" + "1" * 12] == old_digest  # never deleted
    assert "reg.example:5000/tb/base:latest" not in reg.manifests  # promotion's job


def test_a_failed_cell_and_the_cells_built_on_it_publish_nothing(reg):
    jobs = [
        FakeJob("base", "r" + "d" * 12, status=JobState.FAILED),
        FakeJob("torch", "r" + "e" * 12, parent="base", status=JobState.SKIPPED),
        FakeJob("other", "r" + "f" * 12),
    ]
    assert publish_jobs(reg, jobs) == 1
    assert all("/other:" in ref for ref in reg.pushes)


def test_a_refused_login_stops_publishing_before_anything_is_pushed(reg):
    reg.refuse = True
    with pytest.raises(registry.RegistryAuthError, match="log in first"):
        publish_jobs(reg, [FakeJob("base", "r" + "0" * 12)])
    assert reg.pushes == []


def test_the_platforms_of_one_recipe_are_one_index_under_one_tag_or_nothing(reg, monkeypatch):
    """arm64 and amd64 cells of one recipe publish ONE image index under one tag, parents first
    per platform; when one platform failed, the repository publishes nothing (no tag that holds
    only the platform that happened to build), and its children neither."""
    indexes = []

    def push_index(host, target, images):
        indexes.append((target, images))
        reg.manifests[target] = "sha256:" + "7" * 64
        return "sha256:" + "7" * 64

    monkeypatch.setattr(registry, "push_index", push_index)
    a, b = "r" + "a" * 12, "r" + "b" * 12
    jobs = [
        FakeJob("base", a),
        FakeJob("torch", "r" + "c" * 12, parent="base"),
        FakeJob("torch-arm64", "r" + "d" * 12, parent="base-arm64", platform="linux/arm64", repo="torch"),
        FakeJob("base-arm64", b, platform="linux/arm64", repo="base"),
    ]
    assert publish_jobs(reg, jobs) == 4
    assert [t for t, _ in indexes] == [
        f"reg.example:5000/tb/base:{publish.release_tag([a, b])}",
        f"reg.example:5000/tb/torch:{publish.release_tag(['r' + 'c' * 12, 'r' + 'd' * 12])}",
    ]
    assert indexes[0][1] == {"linux/amd64": f"trainbase/base:{a}", "linux/arm64": f"trainbase/base-arm64:{b}"}
    assert (
        reg.pushes == []
        and publish.release_tag([a]) == a
        and publish.release_tag([a, b]) == publish.release_tag([b, a])
    )

    indexes.clear()
    failed = [
        FakeJob("base", "r" + "1" * 12),
        FakeJob("base-arm64", "r" + "2" * 12, platform="linux/arm64", repo="base", status=JobState.FAILED),
        FakeJob("torch", "r" + "3" * 12, parent="base"),
    ]
    out = io.StringIO()
    for j in failed:
        reg.local.setdefault(j.image, "x")
    assert publish.publish(failed, "reg.example:5000/tb", reg.tag_local, out=out) == 0
    assert indexes == [] and reg.pushes == []
    assert "its linux/arm64 image is failed" in out.getvalue()


def test_registry_digest_is_the_digest_or_none_never_a_guess(reg):
    reg.manifests["ghcr.io/o/x:r1"] = "sha256:" + "5" * 64
    assert registry.digest("ghcr.io", "o/x", "r1") == "sha256:" + "5" * 64
    assert registry.digest("ghcr.io", "o/x", "r2") is None
    reg.refuse = True
    with pytest.raises(registry.RegistryAuthError):
        registry.digest("ghcr.io", "o/x", "r1")


# -- promotion: the alias follows the current recipe's digest, registry side, after the gate ------
def promote_run(reg, cells, gate=None):
    from trainbase.deliver import promote, registry

    def retag(src, dst):  # registry side: the alias gets exactly the manifest SRC names
        repo, digest = src.split("@")
        assert any(r.startswith(repo + ":") and d == digest for r, d in reg.manifests.items()), src
        reg.retags.append((src, dst))
        reg.manifests[dst] = digest

    reg.retags = getattr(reg, "retags", [])
    out = io.StringIO()
    steps = promote.plan(cells, "reg.example:5000/tb", registry.digest, {name: ["linux/amd64"] for name, _ in cells})
    return promote.promote(steps, gate, retag, registry.digest, out), out.getvalue()


def test_promotion_retags_the_alias_by_digest_and_follows_a_revert(reg):
    old, new = "r" + "1" * 12, "r" + "2" * 12
    reg.manifests[f"reg.example:5000/tb/base:{old}"] = "sha256:" + "1" * 64
    reg.manifests[f"reg.example:5000/tb/base:{new}"] = "sha256:" + "2" * 64
    (n, held), out = promote_run(reg, [("base", new)])
    assert (n, held) == (1, 0) and reg.manifests["reg.example:5000/tb/base:latest"] == "sha256:" + "2" * 64
    assert reg.retags == [(f"reg.example:5000/tb/base@sha256:{'2' * 64}", "reg.example:5000/tb/base:latest")]
    assert reg.pushes == []  # nothing pushed from a local image
    (n, _), out = promote_run(reg, [("base", new)])
    assert n == 0 and "already" in out
    # the recipe is reverted: its immutable tag is published (long ago), the alias goes back to it
    (n, _), out = promote_run(reg, [("base", old)])
    assert n == 1 and reg.manifests["reg.example:5000/tb/base:latest"] == "sha256:" + "1" * 64


def test_promotion_compares_before_it_swaps(reg):
    """Issue 64: `latest` moved between the plan and the retag (another promotion) is not
    overwritten: the run stops naming what it planned from and what it found."""
    from trainbase.deliver import promote, registry

    new, theirs = "sha256:" + "2" * 64, "sha256:" + "8" * 64
    reg.manifests["reg.example:5000/tb/base:r" + "2" * 12] = new
    reg.manifests["reg.example:5000/tb/base:latest"] = "sha256:" + "1" * 64
    steps = promote.plan([("base", "r" + "2" * 12)], "reg.example:5000/tb", registry.digest, {"base": ["linux/amd64"]})
    reg.manifests["reg.example:5000/tb/base:latest"] = theirs  # the other run's move, after our plan
    retags = []
    with pytest.raises(registry.RegistryError) as e:
        promote.promote(steps, None, lambda src, dst: retags.append(dst), registry.digest, io.StringIO())
    assert retags == [] and reg.manifests["reg.example:5000/tb/base:latest"] == theirs
    assert f"held sha256:{'1' * 64}, it holds {theirs} now" in str(e.value)
    # moved to the very digest we would have set: nothing to do, said
    reg.manifests["reg.example:5000/tb/base:latest"] = new
    out = io.StringIO()
    assert promote.promote(steps, None, lambda src, dst: retags.append(dst), registry.digest, out) == (1, 0)
    assert retags == [] and "moved there since the plan" in out.getvalue()


def test_promotion_waits_for_publication_and_for_the_gate(reg, tmp_path):
    """A candidate moves only on a pass from every required check; a held one holds only its own
    repository (issue 52: one red cell no longer stalls the others; test_promotion_gate.py)."""
    from trainbase.deliver import promote
    from trainbase.supply import vulnscan

    def record(file, name, d, **check):
        (tmp_path / file).write_text(json.dumps({"ref": f"reg.example:5000/tb/{name}@sha256:{d * 64}", **check}))

    a, b = "r" + "a" * 12, "r" + "b" * 12
    reg.manifests[f"reg.example:5000/tb/base:{a}"] = "sha256:" + "a" * 64
    reg.manifests[f"reg.example:5000/tb/torch:{b}"] = "sha256:" + "b" * 64
    for name, d in (("base", "a"), ("torch", "b")):
        record(f"scan-{name}.json", name, d, check=vulnscan.CHECK, passed=True)
    record("gpu-base.json", "base", "a", check="gpu", platform="linux/amd64", passed=True)
    record("gpu-torch.json", "torch", "b", check="gpu", platform="linux/amd64", passed=False)
    cells = [("base", a), ("torch", b), ("tf", "r" + "c" * 12)]
    (n, held), out = promote_run(reg, cells, promote.read_gate(tmp_path))
    assert (n, held) == (1, 1)
    assert "torch: NOT promoted: the gate has no pass for reg.example:5000/tb/torch@sha256:" in out
    assert "failed gpu[linux/amd64]" in out and "tf: reg.example:5000/tb/tf:r" in out
    assert [ref for ref in reg.manifests if ref.endswith(":latest")] == ["reg.example:5000/tb/base:latest"]
    record("gpu-torch.json", "torch", "b", check="gpu", platform="linux/amd64", passed=True)  # a rerun passes
    (n, held), out = promote_run(reg, cells, promote.read_gate(tmp_path))
    assert (n, held) == (1, 0) and reg.manifests["reg.example:5000/tb/torch:latest"] == "sha256:" + "b" * 64


def test_promotion_stops_on_a_registry_that_refuses(reg):
    from trainbase.deliver import registry

    reg.refuse = True
    with pytest.raises(registry.RegistryAuthError, match="docker login reg.example:5000"):
        promote_run(reg, [("base", "r" + "a" * 12)])


def test_a_zstd_twin_is_written_once_beside_the_immutable_tag_and_promoted_with_it(reg, monkeypatch):
    from trainbase.deliver import registry

    def twin(src, dst):
        reg.twins.append((src, dst))
        reg.manifests[dst] = "sha256:" + "7" * 64

    reg.twins = []
    monkeypatch.setattr(registry, "zstd_twin", twin)
    job = FakeJob("base", "r" + "a" * 12)
    reg.local[job.image] = "ab" * 6
    out = io.StringIO()
    assert publish.publish([job], "reg.example:5000/tb", reg.tag_local, out=out, zstd_twin=True) == 1
    tag = "reg.example:5000/tb/base:r" + "a" * 12
    assert reg.twins == [(tag, tag + "-zstd")] and f"wrote {tag}-zstd (zstd layers)" in out.getvalue()
    publish.publish([job], "reg.example:5000/tb", reg.tag_local, out=io.StringIO(), zstd_twin=True)
    assert len(reg.twins) == 1  # immutable: written once
    (n, _), text = promote_run(reg, [("base", "r" + "a" * 12)])
    assert n == 1 and reg.manifests["reg.example:5000/tb/base:latest-zstd"] == "sha256:" + "7" * 64
    assert reg.manifests["reg.example:5000/tb/base:latest"] == reg.manifests[tag]
    assert "latest-zstd -> sha256:" in text
    (n, _), text = promote_run(reg, [("base", "r" + "a" * 12)])
    assert n == 0 and "already" in text


def test_ci_runners_stage_their_platform_and_merge_publishes_the_index_only_when_all_are_staged(reg, monkeypatch):
    """CI builds each platform on its own runner: a run holding one platform of a multi-platform
    repository stages it under <ns>/staging/<cell>; --merge-platforms then pushes the index from
    the staged images, or names the platform still missing and pushes nothing."""
    from trainbase.deliver import platforms
    from trainbase.render import recipes

    a = FakeJob("base", "r" + "a" * 12)
    out = io.StringIO()
    reg.local.setdefault(a.image, "aa")
    assert (
        publish.publish(
            [a], "reg.example:5000/tb", reg.tag_local, out=out, platforms={"base": {"linux/amd64", "linux/arm64"}}
        )
        == 1
    )
    assert reg.pushes == ["reg.example:5000/tb/staging/base:" + a.tag] and "staged" in out.getvalue()

    m = load(ROOT / "matrix.yaml")
    cells = [m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12"), m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12-arm64")]
    rendered = recipes.render_all(m, cells, root=ROOT)
    indexes = []
    # the index is made registry side from the staged manifests (tests/build: the loopback registry)
    monkeypatch.setattr(
        platforms,
        "_index_of_staged",
        lambda host, repo, tag, srcs: indexes.append((f"{host}/{repo}:{tag}", srcs)) or "sha256:" + "8" * 64,
    )
    carried = []  # the staged images' attestations follow into the index (referrers.copy_referrers: tests/build)
    monkeypatch.setattr(platforms, "_carry_attestations", lambda host, ns, repo, cs, tags, out: carried.append(repo))
    reg.manifests[f"reg.example:5000/tb/staging/{cells[0].name}:{rendered[cells[0].name].tag}"] = "sha256:" + "1" * 64
    out = io.StringIO()
    assert platforms.merge_command(m, ROOT, cells, "reg.example:5000/tb", out=out) == 1
    assert indexes == [] and "NOT published: no staged image for linux/arm64" in out.getvalue()
    reg.manifests[f"reg.example:5000/tb/staging/{cells[1].name}:{rendered[cells[1].name].tag}"] = "sha256:" + "2" * 64
    assert platforms.merge_command(m, ROOT, cells, "reg.example:5000/tb", out=io.StringIO()) == 0
    [(target, srcs)] = indexes
    assert carried == [cells[0].name]
    assert target.endswith(f"/tb/{cells[0].name}:" + publish.release_tag([rendered[c.name].tag for c in cells]))
    assert srcs["linux/arm64"] == (f"tb/staging/{cells[1].name}", rendered[cells[1].name].tag)
    assert platforms.expected(m, ROOT)[cells[0].name] == {"linux/amd64", "linux/arm64"}


# -- issue 52: what `latest` can point at ------------------------------------------------------------
def gate_records(tmp_path, records):
    """Gate records as gpu.yml's jobs write them: (repository, digest, check, platform, passed)."""
    from trainbase.deliver import promote

    gate = tmp_path / "gate"
    gate.mkdir(exist_ok=True)
    for i, (name, d, check, platform, passed) in enumerate(records):
        doc = {"ref": f"reg.example:5000/tb/{name}@{d}", "check": check, "passed": passed}
        if platform:
            doc["platform"] = platform
        (gate / f"r{i}.json").write_text(json.dumps(doc))
    return promote.read_gate(gate)


def passes(name, d, platforms=("linux/amd64",)):
    from trainbase.supply import vulnscan

    return [r for p in platforms for r in ((name, d, "gpu", p, True), (name, d, vulnscan.CHECK, p, True))]


def test_a_red_cell_holds_its_own_repository_named_and_the_others_move(reg, tmp_path):
    """Issue 52 (10): one held candidate held every candidate, so a flaky cell, an offline pool
    or a new critical CVE blocked every promotion, security rebuilds included."""
    a, b = "r" + "a" * 12, "r" + "b" * 12
    da, db = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    reg.manifests[f"reg.example:5000/tb/base:{a}"] = da
    reg.manifests[f"reg.example:5000/tb/torch:{b}"] = db
    gate = gate_records(tmp_path, passes("base", da) + [("torch", db, "gpu", "linux/amd64", False)])
    (n, held), out = promote_run(reg, [("base", a), ("torch", b)], gate)
    assert (n, held) == (1, 1), out
    assert reg.manifests["reg.example:5000/tb/base:latest"] == da
    assert "reg.example:5000/tb/torch:latest" not in reg.manifests
    assert "torch: NOT promoted: the gate has no pass for" in out and "failed gpu[linux/amd64]" in out


def test_a_digest_whose_attestations_do_not_verify_is_not_promoted(reg, tmp_path):
    """Issue 52 (7): promote read no referrers, so a digest whose attest step failed after the
    push was promoted anyway."""
    a = "r" + "a" * 12
    da = "sha256:" + "a" * 64
    reg.manifests[f"reg.example:5000/tb/base:{a}"] = da
    gate = gate_records(tmp_path, passes("base", da))
    asked = []

    def attested(ref):
        asked.append(ref)
        return ["sha256:aaaaaaaaaaaa: https://slsa.dev/provenance/v1: nothing attached"]

    from trainbase.deliver import promote
    from trainbase.deliver import registry as regmod

    steps = promote.plan([("base", a)], "reg.example:5000/tb", regmod.digest, {"base": ["linux/amd64"]})
    out = io.StringIO()
    assert promote.promote(
        steps, gate, lambda s, d: pytest.fail("retagged"), regmod.digest, out, attested=attested
    ) == (0, 1)
    assert asked == [f"reg.example:5000/tb/base@{da}"]
    assert "base: NOT promoted: reg.example:5000/tb/base@sha256:" in out.getvalue()
    assert "is not attested: sha256:aaaaaaaaaaaa: https://slsa.dev/provenance/v1: nothing attached" in out.getvalue()


def test_a_rerun_of_an_older_commit_promotes_nothing_and_says_so(reg, tmp_path):
    """Issue 52 (9): re-running an old run's flaky GPU job re-promoted that commit's older
    recipe, moving latest backwards: only main's head recipe may move it."""
    from trainbase.deliver import promote
    from trainbase.deliver import registry as regmod

    old, new = "r" + "1" * 12, "r" + "2" * 12
    reg.manifests[f"reg.example:5000/tb/base:{old}"] = "sha256:" + "1" * 64
    reg.manifests[f"reg.example:5000/tb/base:{new}"] = "sha256:" + "2" * 64
    reg.manifests["reg.example:5000/tb/base:latest"] = "sha256:" + "2" * 64
    gate = gate_records(tmp_path, passes("base", "sha256:" + "1" * 64))
    steps = promote.plan([("base", old)], "reg.example:5000/tb", regmod.digest, {"base": ["linux/amd64"]})
    out = io.StringIO()
    assert promote.promote(
        steps,
        gate,
        lambda s, d: pytest.fail("moved backwards"),
        regmod.digest,
        out,
        recipe_sha="a" * 40,
        head_sha="b" * 40,
    ) == (0, 0)
    assert reg.manifests["reg.example:5000/tb/base:latest"] == "sha256:" + "2" * 64
    assert "NOTHING promoted" in out.getvalue() and "main's head is bbbbbbbbbbbb" in out.getvalue()
    assert promote.stale("c" * 40, "c" * 40) == "" and promote.stale("", "") == ""


def test_each_platform_of_an_index_needs_its_own_scan_record(reg, tmp_path):
    """Issue 52 (8): Trivy scanned an index on an amd64 runner (amd64 only) and its record named
    no platform; the arm64 manifest was never scanned, and nothing required it."""
    from trainbase.deliver import promote
    from trainbase.deliver import registry as regmod
    from trainbase.supply import vulnscan

    a, d = "r" + "a" * 12, "sha256:" + "a" * 64
    reg.manifests[f"reg.example:5000/tb/base:{a}"] = d
    both = ["linux/amd64", "linux/arm64"]
    assert promote.required_checks(both) == (
        "gpu[linux/amd64]",
        "gpu[linux/arm64]",
        f"{vulnscan.CHECK}[linux/amd64]",
        f"{vulnscan.CHECK}[linux/arm64]",
    )
    records = [("base", d, "gpu", p, True) for p in both] + [("base", d, vulnscan.CHECK, "", True)]
    steps = promote.plan([("base", a)], "reg.example:5000/tb", regmod.digest, {"base": both})
    out = io.StringIO()
    assert promote.promote(steps, gate_records(tmp_path, records), lambda s, d: None, regmod.digest, out) == (0, 1)
    assert f"missing {vulnscan.CHECK}[linux/amd64], {vulnscan.CHECK}[linux/arm64]" in out.getvalue()
    gate = gate_records(tmp_path, records + [("base", d, vulnscan.CHECK, p, True) for p in both])
    (n, held), _ = promote_run_platforms(reg, [("base", a)], gate, both)
    assert (n, held) == (1, 0)


def promote_run_platforms(reg, cells, gate, platforms):
    from trainbase.deliver import promote, registry

    def retag(src, dst):
        reg.manifests[dst] = src.split("@")[1]

    out = io.StringIO()
    steps = promote.plan(cells, "reg.example:5000/tb", registry.digest, {n: platforms for n, _ in cells})
    return promote.promote(steps, gate, retag, registry.digest, out), out.getvalue()


def test_the_scan_record_names_the_platform_it_scanned(tmp_path):
    from trainbase.supply import vulnscan

    report = tmp_path / "trivy.json"
    report.write_text(json.dumps({"SchemaVersion": 2, "ArtifactName": "x", "Results": []}))
    ref = "reg.example:5000/tb/base@sha256:" + "a" * 64
    assert (
        vulnscan.main(
            [
                str(report),
                "--ref",
                ref,
                "--cell",
                "base-arm64",
                "--platform",
                "linux/arm64",
                "--gate-dir",
                str(tmp_path / "gate"),
                "--allowlist",
                str(ROOT / "audit-allowlist.yaml"),
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "gate" / "scan-base-arm64.json").read_text())
    assert record["platform"] == "linux/arm64" and record["check"] == vulnscan.CHECK


def test_latest_zstd_moves_only_on_records_for_the_twins_own_digest(reg, tmp_path):
    """Issue 52 (8): latest-zstd followed latest to a digest that no record named."""
    from trainbase.supply import vulnscan

    a, d, twin = "r" + "a" * 12, "sha256:" + "a" * 64, "sha256:" + "7" * 64
    reg.manifests[f"reg.example:5000/tb/base:{a}"] = d
    reg.manifests[f"reg.example:5000/tb/base:{a}-zstd"] = twin
    (n, held), out = promote_run(reg, [("base", a)], gate_records(tmp_path, passes("base", d)))
    assert (n, held) == (1, 0) and reg.manifests["reg.example:5000/tb/base:latest"] == d
    assert "reg.example:5000/tb/base:latest-zstd" not in reg.manifests
    assert f"latest-zstd left at absent: its own digest reg.example:5000/tb/base@{twin}" in out
    gate = gate_records(tmp_path, passes("base", d) + [("base", twin, vulnscan.CHECK, "linux/amd64", True)])
    (n, held), out = promote_run(reg, [("base", a)], gate)
    assert reg.manifests["reg.example:5000/tb/base:latest-zstd"] == twin, out


def test_the_plan_of_unpublished_cells_keeps_a_published_digest_that_lacks_attestations():
    """Issue 52 (7): the next build planned `--only unpublished`, so a digest whose attest step
    failed after the push was never attested, and promotion (now) refuses it for ever."""
    items = [
        {"name": "base", "tag": "r" + "a" * 12},
        {"name": "torch", "tag": "r" + "b" * 12},
        {"name": "tf", "tag": "r" + "c" * 12},
    ]
    digests = {"tb/base": "sha256:" + "a" * 64, "tb/torch": "sha256:" + "b" * 64}
    lacking = {"sha256:" + "a" * 64: ["sha256:aaaaaaaaaaaa: https://slsa.dev/provenance/v1"]}
    kept, left = ci_matrix.with_registry_state(
        items,
        "reg.example:5000/tb",
        "unpublished",
        lambda h, repo, tag: None if tag.endswith("-zstd") else digests.get(repo),
        lambda h, repo, d: lacking.get(d, []),
    )
    assert [e["name"] for e in kept] == ["base", "tf"]
    assert kept[0]["attest"] == ["sha256:aaaaaaaaaaaa: https://slsa.dev/provenance/v1"]
    assert kept[0]["ref"] == "reg.example:5000/tb/base@sha256:" + "a" * 64 and "attest" not in kept[1]
    assert left == {"torch": "published and attested"}
    # the zstd twin is its own digest: one that lacks them is planned too
    twins = {"tb/torch:r" + "b" * 12 + "-zstd": "sha256:" + "7" * 64}
    lacking["sha256:" + "7" * 64] = ["sha256:777777777777: https://cyclonedx.org/bom"]
    kept, _ = ci_matrix.with_registry_state(
        items,
        "reg.example:5000/tb",
        "unpublished",
        lambda h, repo, tag: twins.get(f"{repo}:{tag}") or (digests.get(repo) if not tag.endswith("-zstd") else None),
        lambda h, repo, d: lacking.get(d, []),
    )
    assert [e["name"] for e in kept] == ["base", "torch", "tf"]
    assert kept[1]["attest"] == ["sha256:777777777777: https://cyclonedx.org/bom"]


def test_merge_carries_attestations_into_an_index_that_was_already_published(reg, monkeypatch):
    """Issue 52 (7): the merge skipped attestations when the index tag existed, so a staged
    image attested on a re-run never had them in the published repository."""
    from trainbase.deliver import platforms
    from trainbase.render import recipes

    m = load(ROOT / "matrix.yaml")
    cells = [m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12"), m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12-arm64")]
    rendered = recipes.render_all(m, cells, root=ROOT)
    tag = publish.release_tag([rendered[c.name].tag for c in cells])
    reg.manifests[f"reg.example:5000/tb/{cells[0].name}:{tag}"] = "sha256:" + "8" * 64
    carried = []
    monkeypatch.setattr(platforms, "_carry_attestations", lambda host, ns, repo, cs, tags, out: carried.append(repo))
    monkeypatch.setattr(platforms, "_index_of_staged", lambda *a: pytest.fail("the index was pushed again"))
    out = io.StringIO()
    assert platforms.merge_command(m, ROOT, cells, "reg.example:5000/tb", out=out) == 0
    assert "already published" in out.getvalue() and carried == [cells[0].name]


def test_the_gpu_plan_names_the_zstd_twin_by_its_own_digest_for_the_scan():
    """Issue 52 (8): the twin's alias is gated by records for its own digest, so the plan the
    scan job fans out over names that digest."""
    items = [{"name": "a", "level": 0, "tag": "r000000000001"}, {"name": "b", "level": 0, "tag": "r000000000002"}]
    have = {
        "tb/a:r000000000001": "sha256:" + "1" * 64,
        "tb/a:r000000000001-zstd": "sha256:" + "7" * 64,
        "tb/b:r000000000002": "sha256:" + "2" * 64,
    }
    kept, _ = ci_matrix.with_registry_state(
        items, "reg.example:5000/tb", "unpromoted", lambda h, repo, tag: have.get(f"{repo}:{tag}")
    )
    assert [e["twin_ref"] for e in kept] == ["reg.example:5000/tb/a@sha256:" + "7" * 64, ""]


def test_gpu_yml_scans_each_platform_and_the_zstd_twin_as_its_own_digest():
    """Issue 52 (8), in the workflow: Trivy is told the cell's platform (given an index it scans
    one platform, the runner's unless told), the record names it, and the twin gets its own
    scan and record."""
    doc = yaml.safe_load((ROOT / ".github/workflows/gpu.yml").read_text())
    steps = doc["jobs"]["scan"]["steps"]
    trivy = [s for s in steps if "trivy-action" in s.get("uses", "")]
    assert len(trivy) == 2 and all(s["env"]["TRIVY_PLATFORM"] == "${{ matrix.cell.platform }}" for s in trivy)
    assert [s["with"]["image-ref"] for s in trivy] == ["${{ matrix.cell.ref }}", "${{ matrix.cell.twin_ref }}"]
    records = [s for s in steps if "trainbase.supply.vulnscan" in s.get("run", "")]
    assert len(records) == 2 and all('--platform "$PLATFORM"' in s["run"] for s in records)
    assert records[1]["env"]["REF"] == "${{ matrix.cell.twin_ref }}" and trivy[1]["if"] == records[1]["if"]


def test_one_latest_without_an_sbom_does_not_stop_the_security_check_of_the_others(monkeypatch, capsys, tmp_path):
    """Issue 52 (7): an unattested latest made the refresh's security job exit 2 ("no SBOM"), so
    refreshes and security rebuilds stopped for every row. It is named, the others are checked."""
    from trainbase.deliver import attest, security_rebuild
    from trainbase.supply import security_check

    checked = []

    def fetch(m, root, selected, reg, out_dir, out=None, missing=None):
        missing.append("cellb: reg/tb/cellb:latest (linux/amd64) has no SBOM attached: it cannot be checked")
        return [tmp_path / "cella.cdx.json"]

    monkeypatch.setattr(attest, "fetch_sboms", fetch)
    monkeypatch.setattr(security_check, "check", lambda sboms, today: checked.append(sboms) or {})
    assert security_rebuild.main(["--registry", "reg/tb", "--profile", "ci", "--root", str(ROOT)]) == 0
    assert checked == [[tmp_path / "cella.cdx.json"]]
    assert "::warning title=no SBOM::cellb: reg/tb/cellb:latest" in capsys.readouterr().out
    monkeypatch.setattr(attest, "fetch_sboms", lambda *a, missing=None, **kw: missing.append("x") or [])
    assert security_rebuild.main(["--registry", "reg/tb", "--profile", "ci", "--root", str(ROOT)]) == 2


class _KeylessRegistry:
    """A referrers client holding, for one manifest, a keyless Sigstore bundle per predicate."""

    def __init__(self, digest, predicates):
        import base64

        from trainbase.deliver import attest, referrers

        self.host, self.digest, self.blobs = "reg.example:5000", digest, {}
        self.found = []
        for i, ptype in enumerate(predicates):
            stmt = {"predicateType": ptype, "subject": [{"digest": {"sha256": digest.split(":")[1]}}]}
            bundle = json.dumps({"dsseEnvelope": {"payload": base64.b64encode(json.dumps(stmt).encode()).decode()}})
            self.blobs[f"sha256:b{i}"] = bundle.encode()
            self.found.append(
                referrers.Descriptor(
                    referrers.OCI_MANIFEST,
                    f"sha256:m{i}",
                    1,
                    attest.KEYLESS_BUNDLE,
                    ((attest.SIGSTORE_PREDICATE_ANNOTATION, ptype),),
                )
            )

    def descriptor(self, repo, ref):
        from trainbase.deliver import referrers

        return referrers.Descriptor(referrers.OCI_MANIFEST, self.digest, 1)

    def referrers(self, repo, digest, artifact_type=""):
        return self.found if digest == self.digest else []

    def manifest(self, repo, ref):
        return json.dumps({"layers": [{"digest": "sha256:b" + ref.split(":m")[1]}]}).encode(), ""

    def blob(self, repo, digest):
        return self.blobs[digest]


def test_keyless_attestations_must_be_there_about_the_digest_and_verify_with_gh():
    """Promotion in CI (no key): both keyless bundles on the digest, each a statement about it,
    and -- with --attested-by -- accepted by `gh attestation verify` for the signer workflow."""
    import subprocess

    from trainbase.deliver import attest
    from trainbase.supply import attestation as att

    d = "sha256:" + "a" * 64
    assert attest.attestation_problems(_KeylessRegistry(d, att.PREDICATES), "tb/base", d) == []
    only_sbom = attest.attestation_problems(_KeylessRegistry(d, [att.SBOM]), "tb/base", d)
    assert only_sbom == ["sha256:aaaaaaaaaaaa: https://slsa.dev/provenance/v1: nothing attached"]
    calls = []

    def gh(cmd, **kw):
        calls.append(cmd)
        refused = "provenance" in cmd[-1]
        return subprocess.CompletedProcess(
            cmd, 1 if refused else 0, "", "certificate identity mismatch" if refused else ""
        )

    found = attest.attestation_problems(
        _KeylessRegistry(d, att.PREDICATES), "tb/base", d, github_repo="acme/trainbase", run=gh
    )
    assert found == [
        "sha256:aaaaaaaaaaaa: https://slsa.dev/provenance/v1: gh attestation verify refused it "
        "(certificate identity mismatch)"
    ]
    assert calls[0][:4] == ["gh", "attestation", "verify", f"oci://reg.example:5000/tb/base@{d}"]
    assert "--bundle-from-oci" in calls[0] and "acme/trainbase/.github/workflows/build-cells.yml" in calls[0]
