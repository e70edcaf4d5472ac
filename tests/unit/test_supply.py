"""The supply-chain step's own logic, without an engine: reading an inventory from the image's
answer, the components trainbase downloads, lock comparison messages, and that a cell whose
gate fails keeps no tag."""

import io
import json

import pytest

from trainbase.build import bases
from trainbase.define.matrix import load
from trainbase.render import recipes
from trainbase.run import executor
from trainbase.supply import chain, inventory_reader
from trainbase.supply.inventory import Inventory
from trainbase_common import engine
from trainbase_common.states import USABLE, JobState

from .conftest import ROOT

# What READ_SCRIPT printed in openmpi4.1.4-cuda12.8-cudnn9-debian12 (trimmed)
ANSWER = """@@os
PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION_CODENAME=bookworm
ID=debian
@@deb
adduser\t3.134\tall\t
libssl3\t3.0.17-1~deb12u2\tamd64\topenssl
zlib1g\t1:1.2.13.dfsg-1\tamd64\tzlib
@@pypi
[["mpi4py", "4.1.1"], ["nvidia-nccl-cu12", "2.27.5"]]
@@manifest
{"name": "openmpi4.1.4-cuda12.8-cudnn9-debian12", "size_budget_gb": 9.0}
"""


def test_inventory_from_the_images_answer():
    base = {"ref": "debian:12.15-slim", "identity": "packages-sha256:92bc", "how": "bootstrap"}
    comps = inventory_reader.components_of(
        [{"key": "openmpi-4.1.4-debian", "url": "http://x/o.tar.xz", "sha256": "a" * 64}], "f" * 64
    )
    inv = inventory_reader.parse(ANSWER, "c", "r1", "sha256:1", base, comps)
    assert inv.os == {
        "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)",
        "VERSION_ID": "12",
        "VERSION_CODENAME": "bookworm",
        "ID": "debian",
    }
    debs = {p.name: p for p in inv.of_kind("deb")}
    assert debs["libssl3"].source == "openssl" and debs["adduser"].source == "adduser"  # no source: itself
    assert debs["zlib1g"].version == "1:1.2.13.dfsg-1" and debs["zlib1g"].arch == "amd64"
    assert [(p.name, p.version) for p in inv.of_kind("pypi")] == [("mpi4py", "4.1.1"), ("nvidia-nccl-cu12", "2.27.5")]
    assert {(p.name, p.version) for p in inv.of_kind("component")} == {
        ("openmpi", "4.1.4"),
        ("trainbase-tools", "f" * 12),
    }
    assert Inventory.from_json(json.loads(json.dumps(inv.to_json()))) == inv
    with pytest.raises(Exception, match="no pypi, manifest section"):
        inventory_reader.parse("@@os\nID=debian\n@@deb\n", "c", "r1", "i", base, [])


def test_a_pinned_source_is_a_component_named_by_its_repository_at_its_commit():
    got = inventory_reader.components_of(
        [],
        "f" * 64,
        [{"key": "gdrcopy-2.6", "repository": "NVIDIA/gdrcopy", "tag": "v2.6", "commit": "9" * 40, "tree": "8" * 40}],
    )
    gdrcopy = next(p for p in got if p.name == "gdrcopy")
    assert (gdrcopy.version, gdrcopy.source, gdrcopy.sha256) == (
        "2.6",
        "git+https://github.com/NVIDIA/gdrcopy@" + "9" * 40,
        "",
    )


def test_component_names_and_versions_from_artifact_keys():
    got = inventory_reader.components_of(
        [
            {"key": "miniforge-25.3.0-3", "url": "u", "sha256": "b" * 64},
            {"key": "horovod-0.28.1-sdist", "url": "u", "sha256": "c" * 64},
            {
                "key": "doca-gpg-key",
                "url": "u",
                "sha256": None,
                "openpgp_fingerprint": "CAE649B3B3929F8470D4D33BA024F6F0E6D6A281",
            },
        ],
        "0" * 64,
    )
    assert [(p.name, p.version, bool(p.sha256)) for p in got[1:]] == [
        ("miniforge", "25.3.0-3", True),
        ("horovod", "0.28.1", True),
        ("doca-gpg-key", "A024F6F0E6D6A281", False),
    ]


def test_lock_differences_are_named_with_locked_and_now():
    locked = {
        "base": {"identity": "packages-sha256:aaa"},
        "artifacts": {"openmpi-4.1.4-debian": {"sha256": "1" * 64}},
        "pip_locks": {"locks/python-py3.11.txt": "x"},
    }
    now = {
        "base": {"identity": "packages-sha256:bbb"},
        "artifacts": {"openmpi-4.1.4-debian": {"sha256": "2" * 64}},
        "pip_locks": {"locks/python-py3.11.txt": "x"},
    }
    msg = chain._diff("input", locked, now)
    assert "input artifacts.openmpi-4.1.4-debian.sha256: locked '" + "1" * 64 + "', now '" + "2" * 64 + "'" in msg
    assert "input base.identity: locked 'packages-sha256:aaa', now 'packages-sha256:bbb'" in msg
    assert "pip_locks" not in msg
    assert chain._diff("input", locked, locked) is None
    many = chain._diff("output", {"deb": {f"p{i}": "1" for i in range(12)}}, {"deb": {f"p{i}": "2" for i in range(12)}})
    assert many.endswith("and 4 more")


def test_a_cell_whose_gate_fails_keeps_no_tag(monkeypatch):
    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
    removed = []

    class Gate:
        def after_build(self, j, size):
            return f"{j.name}: cell is 9.84 GB, over its budget of 9.0 GB"

    b.supply = Gate()
    monkeypatch.setattr(engine, "remove_image", lambda ref, force=False: removed.append(ref) or True)
    j = b.jobs[cell.name]
    why = b._supply_chain(j)
    assert "over its budget" in why and removed == [j.image]

    class Crash:
        def after_build(self, j, size):
            raise RuntimeError("dpkg-query missing")

    b.supply, removed[:] = Crash(), []
    assert "supply-chain step failed: RuntimeError: dpkg-query missing" in b._supply_chain(j) and removed == [j.image]
    assert JobState.FAILED.bad


def test_the_base_is_recorded_in_labels_and_read_back():
    base = {
        "ref": "trainbase-bootstrap/debian:12.15-slim",
        "identity": "packages-sha256:" + "ab" * 32,
        "how": "bootstrap",
    }
    labels = bases.base_labels(base)
    assert labels["io.trainbase.base.identity"] == base["identity"]
    assert bases.recorded_base({**labels, "other": "x"}) == base
    # built before the record, or from a base nothing could identify: no record to lock to
    assert bases.recorded_base({}) is None
    assert bases.recorded_base(bases.base_labels({"ref": "x", "identity": "", "how": "absent"})) is None


def test_a_root_cell_build_records_the_base_it_is_built_from(monkeypatch):
    """The build labels the image with the base resolved for this run; a child records nothing
    of its own (it inherits its parent's labels). A later document for the cached tag reads
    these labels, so the tag's SBOM does not depend on what the engine resolves that day."""
    m = load(ROOT / "matrix.yaml")
    cells = [
        m.cell("openmpi5.0.11-cuda13.2-cudnn9-debian12"),
        m.cell("pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12"),
    ]
    rendered = recipes.render_all(m, cells, root=ROOT)
    b = executor.Executor(m, rendered, cells, executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
    root_base = rendered[cells[0].name].context.data["os"]["base"]
    b.base_refs[root_base] = "trainbase-bootstrap/debian:12.15-slim"
    seen = []

    def identity(ref):
        seen.append(ref)
        return {"ref": ref, "identity": "packages-sha256:" + "cd" * 32, "how": "bootstrap"}

    monkeypatch.setattr(bases, "base_identity", identity)
    root_cmd = " ".join(b.command(b.jobs[cells[0].name])[0])
    child_cmd = " ".join(b.command(b.jobs[cells[1].name])[0])
    assert seen == ["trainbase-bootstrap/debian:12.15-slim"]
    assert "io.trainbase.base.identity=packages-sha256:" + "cd" * 32 in root_cmd
    assert "io.trainbase.base.how=bootstrap" in root_cmd
    assert "io.trainbase.base." not in child_cmd


def test_a_tag_gone_from_the_engine_is_named_not_an_attribute_error(monkeypatch, tmp_path):
    """mypy: `engine.inspect_image(...)` is `ImageInfo | None`; the supply step read `.labels`
    of it unguarded, so a cached tag pruned since the plan failed its cell with
    "AttributeError: 'NoneType' object has no attribute 'labels'"."""
    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
    b.supply = chain.SupplyChain(ROOT, chain.SupplyOptions(dir=tmp_path), {}, rendered)
    monkeypatch.setattr(engine, "inspect_image", lambda ref: None)
    monkeypatch.setattr(engine, "remove_image", lambda ref, force=False: True)
    j = b.jobs[cell.name]
    why = b._supply_chain(j, remove_on_failure=False)
    assert "AttributeError" not in why
    assert f"{j.image} is no longer in the engine" in why


def test_a_failed_gate_sticks_to_its_tag_until_the_allowlist_changes(monkeypatch, tmp_path):
    """Issue 64: the gate fails, the tag stays (a cached tag is never removed) and its lock is
    written; the next run used to skip the step ("has documents") and pass the tag as cached.
    The verdict is recorded with the tag: the next run fails the cell (so --push, which publishes
    only usable cells, refuses it) until the allow-list it was judged under changes."""
    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    sc = chain.SupplyChain(ROOT, chain.SupplyOptions(dir=tmp_path, python_audit="off"), {}, rendered)
    base = {"ref": "debian:12.15-slim", "identity": "packages-sha256:92bc", "how": "bootstrap"}
    inv = inventory_reader.parse(ANSWER, cell.name, "r1", "sha256:1", base, [])
    monkeypatch.setattr(inventory_reader, "read", lambda *a, **k: inv)
    monkeypatch.setattr(
        engine, "inspect_image", lambda ref: engine.ImageInfo(id="sha256:1", size=1, labels={}, env={}, raw={})
    )
    monkeypatch.setattr(sc, "_audit", lambda j, inv: ({"ok": True, "message": "", "open": []}, []))
    over = {"ok": False, "message": "cell is 9.84 GB, over its budget of 9.0 GB"}
    monkeypatch.setattr(sc, "_budget", lambda j, inv, size: over)

    def run_once():
        b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
        b.supply = sc
        monkeypatch.setattr(engine, "remove_image", lambda ref, force=False: True)
        monkeypatch.setattr(engine, "tag", lambda *a: None)
        j = b.jobs[cell.name]
        j.status = JobState.CACHED  # the tag exists: a cached cell
        b._supply_for_cached(j)
        return j

    first = run_once()  # no documents yet: the step runs, the gate fails
    assert first.status == JobState.FAILED and "over its budget" in first.reason
    assert sc.has_documents(first) and (sc.cell_dir(first) / "inputs.lock.json").exists()
    verdict = json.loads((sc.cell_dir(first) / "verdict.json").read_text())
    assert verdict["ok"] is False and verdict["tag"] == first.tag

    monkeypatch.setattr(sc, "after_build", lambda j, size: pytest.fail("a judged tag is not judged again"))
    second = run_once()  # documents there: it used to pass here as "cached"
    assert second.status == JobState.FAILED and JobState.FAILED not in USABLE
    assert "the supply gate refused" in second.reason and "over its budget" in second.reason

    sc.allowlist_sha256 = "another allow-list"  # what the allow-list accepts may have changed: judged again
    monkeypatch.setattr(sc, "after_build", lambda j, size: None)
    assert sc.needs_step(second) and run_once().status == JobState.CACHED


def test_a_tag_documented_before_the_verdict_record_reads_its_gates_documents(tmp_path):
    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    sc = chain.SupplyChain(ROOT, chain.SupplyOptions(dir=tmp_path), {}, rendered)
    b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
    j = b.jobs[cell.name]
    d = sc.cell_dir(j)
    d.mkdir(parents=True)
    for name in ("inputs.lock.json", "sbom.cdx.json"):
        (d / name).write_text("{}")
    (d / "audit.json").write_text(json.dumps({"ok": False, "message": "CVE-2099-1 in libssl3"}))
    (d / "budget.json").write_text(json.dumps({"ok": True}))
    assert not sc.needs_step(j) and "CVE-2099-1 in libssl3" in sc.recorded_failure(j)
    (d / "audit.json").write_text(json.dumps({"ok": True}))
    assert sc.recorded_failure(j) is None


def test_a_tag_killed_before_its_sbom_layer_is_finished_by_the_next_run(monkeypatch, tmp_path):
    """Issue 64: a kill -9 after the documents were written but before the SBOM layer was
    attached (and `latest` tagged) left four files that said "done": no rerun added the layer or
    the alias, and --push published a tag without its SBOM. The layer (its label naming the
    recorded SBOM) is now part of "documents complete", and a cached complete tag gets `latest`."""
    m = load(ROOT / "matrix.yaml")
    cell = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    rendered = recipes.render_all(m, [cell], root=ROOT)
    sc = chain.SupplyChain(ROOT, chain.SupplyOptions(dir=tmp_path, python_audit="off"), {}, rendered)
    b = executor.Executor(m, rendered, [cell], executor.Options(ca_bundle="none"), ROOT, out=io.StringIO())
    b.supply = sc
    j = b.jobs[cell.name]
    d = sc.cell_dir(j)
    d.mkdir(parents=True)
    (d / "inputs.lock.json").write_text(json.dumps({"outputs": {"sbom_sha256": "sha256:5b0"}}))
    (d / "sbom.cdx.json").write_text("{}")
    for name in ("audit.json", "budget.json"):
        (d / name).write_text(json.dumps({"ok": True}))
    sc._record_verdict(j, [])  # the verdict too: the kill came after it, before the layer
    labels: dict[str, str] = {}
    monkeypatch.setattr(
        engine, "inspect_image", lambda ref: engine.ImageInfo(id="sha256:1", size=1, labels=labels, env={}, raw={})
    )
    tags, steps = [], []
    monkeypatch.setattr(engine, "tag", lambda src, dst: tags.append(dst))
    assert sc.files_complete(j) and not sc.has_documents(j) and sc.needs_step(j)

    def after_build(job, size):
        steps.append(job.name)
        labels["io.trainbase.sbom.sha256"] = "sha256:5b0"  # what _attach does
        return None

    monkeypatch.setattr(sc, "after_build", after_build)
    j.status = JobState.CACHED
    b._supply_for_cached(j)
    assert steps == [cell.name] and j.status == JobState.CACHED and tags[-1].endswith(":latest")
    assert "lacks its SBOM layer" in b.out.getvalue()
    assert sc.has_documents(j) and not sc.needs_step(j)

    # complete, but killed before `latest`: the next run tags it, and runs no step
    tags.clear()
    monkeypatch.setattr(sc, "after_build", lambda job, size: pytest.fail("a complete tag is not documented again"))
    b._supply_for_cached(j)
    assert j.status == JobState.CACHED and tags == [j.image.rsplit(":", 1)[0] + ":latest"]
