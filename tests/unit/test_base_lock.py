"""The committed base lock (locks/bases.json): the recipe tag folds in the base's locked
identity, a locked bootstrap row never takes the official image, and a base that is not the
locked one is refused naming locked and resolved identity and the packages that moved -- after
one fresh bootstrap, since an engine may hold one from before a Debian point release."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from trainbase.build import bases, bootstrap
from trainbase.define import base_lock
from trainbase.define.matrix import load
from trainbase.errors import TrainbaseError
from trainbase.render import recipes
from trainbase.run import executor
from trainbase_common import engine
from trainbase_common.states import JobState

from .conftest import ROOT

BASE = "debian:12.15-slim"
OWN = "trainbase-bootstrap/debian:12.15-slim"
LOCKED = "packages-sha256:" + "ab" * 32
PACKAGES = ["apt 2.6.1", "libc6 2.36-9+deb12u10", "tzdata 2025b-0+deb12u1"]


def _scratch(tmp_path, identity=LOCKED):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in ("matrix.yaml", "templates", "imagefs", "locks", "patches"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp_path / name)
    entries = base_lock.load(tmp_path)
    entries[BASE] = base_lock.BaseLock(ref=BASE, how=base_lock.BOOTSTRAP, identity=identity, packages=PACKAGES)
    base_lock.write(tmp_path, entries)
    return load(tmp_path / "matrix.yaml")


def test_the_committed_lock_locks_the_local_row_and_reads_back():
    entries = base_lock.load(ROOT)
    deb = entries[BASE]
    assert deb.how == base_lock.BOOTSTRAP and deb.identity.startswith("packages-sha256:") and len(deb.packages) > 50
    # every base a cell of matrix.yaml names has an entry (locked, or unlocked with the reason)
    m = load(ROOT / "matrix.yaml")
    from trainbase.render import context

    bases = {context.build(m, c).data["os"]["base"] for c in m.included if not c.parent}
    assert bases <= set(entries), bases - set(entries)
    assert all(e.identity or e.note for e in entries.values())


def test_an_unreadable_lock_is_bad_input_naming_the_file(tmp_path):
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "bases.json").write_text(json.dumps({"schema": 1, "bases": {BASE: {"how": "guess"}}}))
    with pytest.raises(TrainbaseError, match=r"locks/bases.json: unreadable: .*how must be"):
        base_lock.load(tmp_path)


def test_the_tag_folds_in_the_locked_base(tmp_path):
    """A new locked identity changes every debian12 tag (children through their parent) and no
    tag of another row."""
    m = _scratch(tmp_path / "a")
    before = {n: r.tag for n, r in recipes.render_all(m, root=tmp_path / "a").items()}
    m2 = _scratch(tmp_path / "b", identity="packages-sha256:" + "cd" * 32)
    after = {n: r.tag for n, r in recipes.render_all(m2, root=tmp_path / "b").items()}
    moved = {n for n in before if before[n] != after[n]}
    assert moved == {n for n in before if n.endswith("-debian12")}, sorted(set(before) - moved)[:3]


def test_package_changes_are_named():
    now = ["apt 2.6.1", "libc6 2.36-9+deb12u13", "newpkg 1.0"]
    assert (
        base_lock.package_changes(PACKAGES, now)
        == "libc6 2.36-9+deb12u10 -> 2.36-9+deb12u13, +newpkg 1.0, -tzdata 2025b-0+deb12u1"
    )
    lock = base_lock.BaseLock(ref=BASE, how=base_lock.BOOTSTRAP, identity=LOCKED, packages=PACKAGES)
    why = base_lock.mismatch(lock, {"ref": OWN, "identity": "packages-sha256:" + "ef" * 32, "how": "bootstrap"}, now)
    assert f"locked {LOCKED}, resolved packages-sha256:{'ef' * 32}" in why and "libc6 2.36-9+deb12u10 ->" in why
    assert "build.py lock-bases" in why
    assert base_lock.mismatch(lock, {"identity": LOCKED}, None) is None
    assert base_lock.mismatch(base_lock.unlocked(BASE, base_lock.REGISTRY), {"identity": "x"}, None) is None


def test_a_locked_bootstrap_row_never_looks_at_the_official_image(monkeypatch):
    calls = []
    monkeypatch.setattr(engine, "available", lambda: True)
    monkeypatch.setattr(engine, "image_exists", lambda ref: calls.append(("exists", ref)) or True)
    monkeypatch.setattr(engine, "pull", lambda ref: calls.append(("pull", ref)))
    monkeypatch.setattr(
        engine,
        "inspect_image",
        lambda ref: engine.ImageInfo(
            id="sha256:" + "1" * 64, size=1, labels={"io.trainbase.base.source": "debootstrap"}, env={}, raw={}
        ),
    )
    assert bootstrap.ensure_base_image(BASE, "bookworm", log=lambda s: None, bootstrap_only=True) == (
        "bootstrap present",
        OWN,
    )
    assert ("exists", BASE) not in calls and not [c for c in calls if c[0] == "pull"]


def _executor(tmp_path, monkeypatch, resolved_identities):
    m = _scratch(tmp_path)
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=tmp_path)
    b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), tmp_path, out=io.StringIO())
    ensured, removed = [], []

    def ensure(ref, suite, mirror, log, bootstrap_only=False, arch=None):
        ensured.append(bootstrap_only)
        return "bootstrap present", OWN

    idents = iter(resolved_identities)
    monkeypatch.setattr(bootstrap, "ensure_base_image", ensure)
    monkeypatch.setattr(bases, "base_identity", lambda ref: {"ref": ref, "identity": next(idents), "how": "bootstrap"})
    monkeypatch.setattr(bootstrap, "packages_of", lambda image: ["apt 2.6.1", "libc6 2.36-9+deb12u13"])
    monkeypatch.setattr(engine, "remove_image", lambda ref, force=False: removed.append(ref) or True)
    return b, b.jobs[cell.name], ensured, removed


def test_the_locked_base_builds(tmp_path, monkeypatch):
    b, j, ensured, removed = _executor(tmp_path, monkeypatch, [LOCKED])
    b.ensure_bases()
    assert j.status == JobState.QUEUED and b.base_refs[BASE] == OWN
    assert ensured == [True] and removed == []


def test_an_old_bootstrap_is_made_again_once_then_a_moved_base_is_refused(tmp_path, monkeypatch):
    moved = "packages-sha256:" + "ef" * 32
    b, j, ensured, removed = _executor(tmp_path, monkeypatch, [moved, moved])
    b.ensure_bases()
    assert removed == [OWN] and ensured == [True, True]
    assert j.status == JobState.FAILED
    assert f"base {BASE} is not the locked one: locked {LOCKED}, resolved {moved}" in j.reason
    assert "libc6 2.36-9+deb12u10 -> 2.36-9+deb12u13" in j.reason and "-tzdata" in j.reason


def test_a_fresh_bootstrap_that_matches_the_lock_replaces_an_old_one(tmp_path, monkeypatch):
    b, j, ensured, removed = _executor(tmp_path, monkeypatch, ["packages-sha256:" + "ef" * 32, LOCKED])
    b.ensure_bases()
    assert removed == [OWN] and j.status == JobState.QUEUED


CUDA_BASE = "nvidia/cuda:12.8.1-base-ubuntu22.04"
CUDA_DIGEST = "sha256:" + "5a" * 32


def _registry_locked(tmp_path):
    m = _scratch(tmp_path)
    entries = base_lock.load(tmp_path)
    entries[CUDA_BASE] = base_lock.BaseLock(ref=CUDA_BASE, how=base_lock.REGISTRY, identity=CUDA_DIGEST)
    base_lock.write(tmp_path, entries)
    return m


def test_references_of_a_registry_locked_base():
    lock = base_lock.BaseLock(ref=CUDA_BASE, how=base_lock.REGISTRY, identity=CUDA_DIGEST)
    assert lock.from_ref() == f"{CUDA_BASE}@{CUDA_DIGEST}"
    assert lock.engine_ref() == f"nvidia/cuda@{CUDA_DIGEST}"
    assert engine.repository("localhost:5000/team/cuda:12.8") == "localhost:5000/team/cuda"
    assert engine.repository("localhost:5000/team/cuda") == "localhost:5000/team/cuda"
    assert engine.repository("debian@" + CUDA_DIGEST) == "debian"
    # a bootstrap or an unlocked entry is named by its tag: nothing to pin
    for other in (
        base_lock.BaseLock(ref=BASE, how=base_lock.BOOTSTRAP, identity=LOCKED),
        base_lock.unlocked(CUDA_BASE, base_lock.REGISTRY),
    ):
        assert other.digest is None and other.from_ref() == other.engine_ref() == other.ref


def test_a_registry_locked_base_is_built_from_its_digest(tmp_path):
    """Locking an nvidia/cuda base by digest writes the digest into FROM of that row's
    Dockerfiles (and so into their tags); every other row renders as before."""
    base = tmp_path / "a"
    m = _scratch(base)
    before = recipes.render_all(m, root=base)
    m2 = _registry_locked(tmp_path / "b")
    after = recipes.render_all(m2, root=tmp_path / "b")
    pinned = {n for n, r in after.items() if f"FROM {CUDA_BASE}@{CUDA_DIGEST} AS os" in r.files[r.dockerfile]}
    row = {n for n, r in after.items() if r.context.data["os"]["base"] == CUDA_BASE}
    assert pinned and pinned == {n for n in row if not after[n].cell.parent}
    moved = {n for n in before if before[n].tag != after[n].tag}
    children = {n for n in after if after[n].cell.parent and any(p in pinned for p in _ancestors(m2, n))}
    assert moved == pinned | children
    assert all(f"FROM {CUDA_BASE} AS os" in before[n].files[before[n].dockerfile] for n in pinned)


def _ancestors(m, name):
    cell = m.cell(name)
    while cell.parent:
        cell = m.cell(cell.parent)
        yield cell.name


def test_a_registry_locked_base_is_pulled_by_its_digest_not_its_tag(tmp_path, monkeypatch):
    m = _registry_locked(tmp_path)
    calls = []

    def ensure(ref, suite=None, mirror=None, log=None, bootstrap_only=False, arch=None):
        calls.append((ref, suite, bootstrap_only))
        return "pulled", ref

    monkeypatch.setattr(bootstrap, "ensure_base_image", ensure)
    monkeypatch.setattr(
        bases, "base_identity", lambda ref: {"ref": ref, "identity": CUDA_DIGEST, "how": "registry digest"}
    )
    row = m.spec.os["ubuntu22.04"]
    lock = base_lock.load(tmp_path)[CUDA_BASE]
    assert bases.resolve(CUDA_BASE, row, lock, log=lambda s: None) == (f"nvidia/cuda@{CUDA_DIGEST}", None)
    assert calls == [(f"nvidia/cuda@{CUDA_DIGEST}", None, False)]


def test_the_identity_of_an_image_pulled_under_two_names_is_its_own_repositorys(monkeypatch):
    other = "sha256:" + "0f" * 32
    monkeypatch.setattr(
        engine,
        "inspect_image",
        lambda ref: engine.ImageInfo(
            id="sha256:" + "1" * 64,
            size=1,
            labels={},
            env={},
            raw={"RepoDigests": [f"mirror.example:5000/nvidia/cuda@{other}", f"nvidia/cuda@{CUDA_DIGEST}"]},
        ),
    )
    assert bases.base_identity(CUDA_BASE)["identity"] == CUDA_DIGEST
    assert bases.base_identity("docker.io/" + CUDA_BASE)["identity"] == CUDA_DIGEST
    assert bases.base_identity("mirror.example:5000/nvidia/cuda:12.8")["identity"] == other


def test_a_base_asked_for_by_digest_is_that_digest_even_with_bootstrap_labels(monkeypatch):
    """A registry-locked base made FROM a trainbase bootstrap (a team's mirror of it) still
    carries the bootstrap's package label: asked for by digest, its identity is the digest."""
    monkeypatch.setattr(
        engine,
        "inspect_image",
        lambda ref: engine.ImageInfo(
            id="sha256:" + "1" * 64,
            size=1,
            labels={"io.trainbase.base.packages-sha256": "ab" * 32},
            env={},
            raw={"RepoDigests": [f"registry.example/team/debian@{CUDA_DIGEST}"]},
        ),
    )
    assert bases.base_identity(f"registry.example/team/debian@{CUDA_DIGEST}") == {
        "ref": f"registry.example/team/debian@{CUDA_DIGEST}",
        "identity": CUDA_DIGEST,
        "how": "registry digest",
    }
    assert bases.base_identity("registry.example/team/debian:12")["how"] == "bootstrap"


def _registry_rows(tmp_path):
    """A scratch matrix whose selection includes registry rows (nvidia/cuda bases)."""
    m = _scratch(tmp_path)
    from trainbase.render import context

    # the registry rows and BASE's (the one bootstrapped row these tests fake): another
    # bootstrapped row (Debian 13) would really debootstrap inside a unit test
    cells = []
    refs = set()
    for c in (c for c in m.included if not c.parent):
        os_ = context.build(m, c).data["os"]
        if os_["bootstrappable"] and os_["base"] != BASE:
            continue
        cells.append(c)  # the shipped base, and the compile stages' build base (the Ubuntu rows' devel image)
        refs |= {os_["base"], os_["build_base"]} - {None}
    return m, cells, sorted(r for r in refs if r != BASE)


def test_lock_bases_reads_registry_digests_without_pulling(tmp_path, monkeypatch):
    """--lock-bases asks the registry's manifest API for each registry row's digest (the engine's
    distribution endpoint): nothing is pulled, every row is locked to what the registry said."""
    m, cells, registry_refs = _registry_rows(tmp_path)
    assert registry_refs, "the matrix has registry rows (nvidia/cuda)"
    monkeypatch.setattr(engine, "pull", lambda ref: pytest.fail(f"pulled {ref}"))
    monkeypatch.setattr(bootstrap, "ensure_base_image", lambda *a, **k: ("bootstrap present", OWN))
    monkeypatch.setattr(engine, "remove_image", lambda ref: None)
    monkeypatch.setattr(bases, "base_identity", lambda ref: {"identity": LOCKED, "how": "bootstrap"})
    monkeypatch.setattr(bootstrap, "packages_of", lambda ref: PACKAGES)
    asked = []
    monkeypatch.setattr(
        engine, "distribution_digest", lambda ref: asked.append(ref) or "sha256:" + f"{len(asked):064x}"
    )
    entries = bases.relock(m, tmp_path, cells, log=lambda s: None, refresh=True)
    assert sorted(asked) == registry_refs
    for ref in registry_refs:
        assert entries[ref].how == base_lock.REGISTRY and entries[ref].identity.startswith("sha256:")
    assert base_lock.load(tmp_path)[registry_refs[0]].identity == entries[registry_refs[0]].identity


def test_lock_bases_fails_naming_each_base_no_registry_answered_for(tmp_path, monkeypatch):
    """A registry that does not answer fails the refresh, naming the base and the cause; the
    rows that did resolve are still written (no silent 'unresolved' note, no weekly no-op PR)."""
    m, cells, registry_refs = _registry_rows(tmp_path)
    monkeypatch.setattr(bootstrap, "ensure_base_image", lambda *a, **k: ("bootstrap present", OWN))
    monkeypatch.setattr(engine, "remove_image", lambda ref: None)
    monkeypatch.setattr(bases, "base_identity", lambda ref: {"identity": LOCKED, "how": "bootstrap"})
    monkeypatch.setattr(bootstrap, "packages_of", lambda ref: PACKAGES)
    broken = registry_refs[0]

    def digest(ref):
        if ref == broken:
            raise engine.EngineAPIError(401, "unauthorized: authentication required")
        return "sha256:" + "c" * 64

    monkeypatch.setattr(engine, "distribution_digest", digest)
    with pytest.raises(TrainbaseError) as e:
        bases.relock(m, tmp_path, cells, log=lambda s: None, refresh=True)
    assert broken in str(e.value) and "authentication required" in str(e.value)
    written = base_lock.load(tmp_path)
    assert all(written[r].identity == "sha256:" + "c" * 64 for r in registry_refs if r != broken)


def test_lock_bases_without_all_adds_only_the_missing_bases_and_moves_no_tag(tmp_path, monkeypatch):
    """Adding a CUDA row, as docs/matrix.md says: `--lock-bases` locks the new row's base and
    keeps every locked one -- no fresh debootstrap (root, and today's mirror would move every
    Debian tag), no registry question for a base already locked."""
    m, cells, registry_refs = _registry_rows(tmp_path)
    lock = base_lock.load(tmp_path)
    new = registry_refs[0]
    for ref in registry_refs[1:]:  # locked where a registry answered (CI), one row new
        lock[ref] = base_lock.BaseLock(ref=ref, how=base_lock.REGISTRY, identity="sha256:" + "e" * 64, note="")
    lock.pop(new, None)
    base_lock.write(tmp_path, lock)
    monkeypatch.setattr(bootstrap, "ensure_base_image", lambda *a, **k: pytest.fail("bootstrapped again"))
    asked = []
    monkeypatch.setattr(engine, "distribution_digest", lambda ref: asked.append(ref) or "sha256:" + "d" * 64)
    entries = bases.relock(m, tmp_path, cells, log=lambda s: None)
    assert asked == [new] and entries[new].identity == "sha256:" + "d" * 64
    assert {k: v for k, v in entries.items() if k != new} == dict(lock.items())


def test_lock_bases_offline_writes_unlocked_entries_saying_why_and_drops_unused_bases(tmp_path, monkeypatch):
    """Issue 65 item 3/4, met while moving the Ubuntu rows to other nvidia/cuda flavours (issue 61):
    with no registry, a base with no entry got none ("NOT resolved, entry kept") and the count was
    wrong; now it is written as unlocked with the reason, and a base no cell uses any more is
    dropped, so locks/bases.json names exactly what the matrix builds FROM."""
    m, cells, registry_refs = _registry_rows(tmp_path)
    lock = base_lock.load(tmp_path)
    for ref in registry_refs:
        lock.pop(ref, None)
    gone = "nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04"
    lock[gone] = base_lock.unlocked(gone, base_lock.REGISTRY, "a row dropped from the matrix")
    base_lock.write(tmp_path, lock)

    def no_registry(ref):
        raise engine.EngineAPIError(500, "registry unreachable")

    monkeypatch.setattr(engine, "distribution_digest", no_registry)
    said: list[str] = []
    with pytest.raises(TrainbaseError):
        bases.relock(m, tmp_path, cells, log=said.append)
    written = base_lock.load(tmp_path)
    assert gone not in written and any("no cell of the matrix uses it" in s for s in said)
    for ref in registry_refs:
        assert written[ref].identity is None and "did not answer" in written[ref].note, ref
    assert any(r.endswith("-devel-ubuntu24.04") for r in registry_refs), "the toolchain stage's base is locked too"
