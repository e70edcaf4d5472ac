"""The supply-chain step of real builds: every built cell has its documents and carries its
SBOM; a tampered checksum stops the cell naming file, expected and actual hash; --locked
reproduces a cell from its lock and refuses one whose inputs moved; an over-budget cell fails
with its largest layers named and keeps no tag."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from trainbase_common import engine

from .conftest import ROOT

pytestmark = pytest.mark.engine
PY = sys.executable
# a ci-profile cell with no long compile (no Open MPI, no nccl-tests): its no-cache rebuild is minutes
CHEAP = "intelmpi2021.18-cuda12.8-cudnn9-debian12"
DOCS = ("inputs.lock.json", "inventory.json", "sbom.cdx.json", "audit.json", "budget.json", "release-notes.md")


def _build(cwd, *args, timeout=3600):
    return subprocess.run(
        [PY, str(ROOT / "build.py"), "--matrix", "--file", str(cwd / "matrix.yaml"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_built_cell_has_its_documents_and_carries_its_sbom(build_report, docker):
    for c in [c for c in build_report["cells"] if c["selected"]]:
        assert c["supply"] and set(DOCS) <= set(c["supply"]["documents"]), (c["name"], c["supply"])
        sbom_text = Path(c["supply"]["documents"]["sbom.cdx.json"]).read_text()
        labels = engine.inspect_image(c["image"]).labels
        digest = hashlib.sha256(sbom_text.encode()).hexdigest()
        assert labels["io.trainbase.sbom.sha256"] == digest, c["name"]
        r = subprocess.run(
            [docker, "run", "--rm", c["image"], "sha256sum", labels["io.trainbase.sbom"]],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0 and r.stdout.split()[0] == digest, (c["name"], r.stdout, r.stderr)
        lock = json.loads(Path(c["supply"]["documents"]["inputs.lock.json"]).read_text())
        assert lock["tag"] == c["tag"] and lock["outputs"]["sbom_sha256"] == digest
        audit = json.loads(Path(c["supply"]["documents"]["audit.json"]).read_text())
        assert audit["ok"] and audit["blocked"] == 0, audit["message"]


def test_a_cached_tag_documented_again_gets_the_same_sbom(build_report, tmp_path):
    """One tag, one SBOM: documents made later for the cached tag (a fresh clone, a CI runner
    that pulled it) say the same as the build's, because the base is read from what the image
    recorded at build time, not resolved again that day; and the image is not re-labelled."""
    cell = next(c for c in build_report["cells"] if c["name"] == CHEAP)
    before = engine.inspect_image(cell["image"])
    report = tmp_path / "report.json"
    r = _build(ROOT, "--select", f"name={CHEAP}", "--supply-dir", str(tmp_path / "supply"), "--report", str(report))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "cached without supply-chain documents: making them" in r.stdout, r.stdout[-2000:]
    again = json.loads((tmp_path / "supply" / CHEAP / cell["tag"] / "inputs.lock.json").read_text())
    first = json.loads(Path(cell["supply"]["documents"]["inputs.lock.json"]).read_text())
    assert again["inputs"]["base"] == first["inputs"]["base"] and again["inputs"]["base"]["identity"], again["inputs"]
    assert again["outputs"]["sbom_sha256"] == first["outputs"]["sbom_sha256"]
    assert engine.inspect_image(cell["image"]).id == before.id, "documenting a cached tag re-labelled it"


def test_tampered_checksum_names_file_expected_and_actual(scratch, docker):
    data = yaml.safe_load((scratch / "matrix.yaml").read_text())
    art = data["artifacts"]["openmpi-4.1.4-debian"]
    real, fake = art["sha256"], "0" * 63 + "f"
    art["sha256"] = fake
    (scratch / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert (
        subprocess.run(
            [PY, str(ROOT / "build.py"), "--render", "--file", str(scratch / "matrix.yaml")],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    report = scratch / "report.json"
    r = _build(scratch, "--select", "name=openmpi4.1.4-cuda12.8-cudnn9-debian12", "--report", str(report))
    assert r.returncode == 1, r.stdout + r.stderr
    reason = json.loads(report.read_text())["cells"][0]["reason"]
    assert f"tb-fetch: sha256 mismatch for {art['url']}: expected {fake}, got {real}" == reason, reason


def test_locked_refuses_a_cell_whose_input_moved(build_report, tmp_path):
    """The lock says one sha256 for Open MPI's tarball, matrix.yaml now another: refused before
    anything builds, naming the input, the locked and the current value."""
    cell = next(c for c in build_report["cells"] if c["name"] == CHEAP)
    supply = tmp_path / "supply"
    shutil.copytree(ROOT / "reports" / "supply" / CHEAP / cell["tag"], supply / CHEAP / cell["tag"])
    lock_path = supply / CHEAP / cell["tag"] / "inputs.lock.json"
    lock = json.loads(lock_path.read_text())
    lock["inputs"]["pip_locks"] = dict.fromkeys(lock["inputs"]["pip_locks"], "0" * 64)
    lock_path.write_text(json.dumps(lock))
    report = tmp_path / "report.json"
    r = _build(ROOT, "--locked", "--select", f"name={CHEAP}", "--supply-dir", str(supply), "--report", str(report))
    assert r.returncode == 1, r.stdout + r.stderr
    got = json.loads(report.read_text())["cells"][0]
    assert got["status"] == "refused" and "input pip_locks.locks/" in got["reason"], got["reason"]
    assert "locked '" + "0" * 64 + "', now '" in got["reason"]


@pytest.mark.slow
def test_locked_rebuild_reproduces_the_lock(build_report):
    """Without cache, from the same inputs: the same installed packages, manifest and SBOM."""
    cell = next(c for c in build_report["cells"] if c["name"] == CHEAP)
    r = _build(ROOT, "--locked", "--select", f"name={CHEAP}", "--report", "/dev/null")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "result: 1 built" in r.stdout
    assert (
        engine.inspect_image(cell["image"]).labels["io.trainbase.sbom.sha256"]
        == json.loads(Path(cell["supply"]["documents"]["inputs.lock.json"]).read_text())["outputs"]["sbom_sha256"]
    )


def test_over_budget_cell_fails_with_its_largest_layers_and_keeps_no_tag(scratch, docker):
    data = yaml.safe_load((scratch / "matrix.yaml").read_text())
    data["os"]["debian12"]["size_budget_gb"] = 0.5
    (scratch / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert (
        subprocess.run(
            [PY, str(ROOT / "build.py"), "--render", "--file", str(scratch / "matrix.yaml")],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    report = scratch / "report.json"
    r = _build(scratch, "--select", f"name={CHEAP}", "--report", str(report))
    assert r.returncode == 1, r.stdout + r.stderr
    got = json.loads(report.read_text())["cells"][0]
    assert got["status"] == "failed"
    assert f"cell {CHEAP} is " in got["reason"] and "over its budget of 0.5 GB" in got["reason"], got["reason"]
    assert "largest layers" in got["reason"].lower() and "RUN " in got["reason"], got["reason"]
    assert not engine.image_exists(got["image"]), "an over-budget cell keeps no tag"


@pytest.mark.slow
def test_a_base_that_is_not_the_locked_one_is_refused(scratch):
    """locks/bases.json says another Debian bootstrap than the mirror gives: the engine's
    bootstrap is made again once, still differs, and the cell fails before any build step,
    naming the base, locked and resolved identity, and the package that moved."""
    lock_path = scratch / "locks" / "bases.json"
    lock = json.loads(lock_path.read_text())
    deb = lock["bases"]["debian:12.15-slim"]
    real_identity = deb["identity"]
    name, version = deb["packages"][0].split(" ", 1)
    deb["identity"] = "packages-sha256:" + "0" * 64
    deb["packages"][0] = f"{name} {version}~older"
    lock_path.write_text(json.dumps(lock))
    assert (
        subprocess.run(
            [PY, str(ROOT / "build.py"), "--render", "--file", str(scratch / "matrix.yaml")],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    report = scratch / "report.json"
    r = _build(scratch, "--select", f"name={CHEAP}", "--report", str(report))
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    got = json.loads(report.read_text())["cells"][0]
    assert got["status"] == "failed" and not engine.image_exists(got["image"])
    assert (
        f"base debian:12.15-slim is not the locked one: locked packages-sha256:{'0' * 64}, resolved {real_identity}"
    ) in got["reason"], got["reason"]
    assert f"{name} {version}~older -> {version}" in got["reason"], got["reason"]
    assert "not the locked one: making it again" in r.stdout and "bootstrapped as" in r.stdout, r.stdout[-2000:]


def test_a_registry_locked_base_is_pulled_and_built_by_its_digest_after_its_tag_moved(registry, docker, tmp_path):
    """The nvidia/cuda rows are locked by registry digest where a registry answers (Docker Hub
    does not here), so the same path is run against the loopback registry with a login: a
    base is pushed and locked, then its tag is moved upstream to another image. The build's
    resolver still pulls the locked digest, not the tag, and a Dockerfile FROM the rendered
    ``name:tag@digest`` is built from the locked image."""
    from trainbase.build import bootstrap
    from trainbase.define import base_lock

    src = bootstrap.bootstrap_ref("debian:12.15-slim")
    assert engine.image_exists(src), f"{src} is made by the ci build that runs before these tests"
    cfg = ["--config", str(registry.config)]
    ref = f"{registry.host}/trainbase-test/locked-base:1"
    made = []

    def docker_(*args, cwd=None):
        r = subprocess.run(
            [docker, *cfg, *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**registry.env(), "DOCKER_BUILDKIT": "1"},
            timeout=600,
            check=False,
        )
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stdout[-1500:]}{r.stderr[-1500:]}"
        return r.stdout.strip()

    def push_variant(which):
        (tmp_path / which).mkdir()
        (tmp_path / which / "Dockerfile").write_text(f"FROM {src}\nLABEL io.trainbase.test.which={which}\n")
        docker_("build", "-q", "-t", ref, str(tmp_path / which))
        made.append(docker_("image", "inspect", "--format", "{{.Id}}", ref))
        docker_("push", "-q", ref)
        return docker_("image", "inspect", "--format", "{{index .RepoDigests 0}}", ref).split("@", 1)[1]

    try:
        locked = push_variant("locked")
        moved = push_variant("moved")  # the same tag, now another image upstream
        assert locked != moved
        for image_id in made:  # nothing local: the resolver must pull
            docker_("image", "rm", "-f", image_id)
        lock = base_lock.BaseLock(ref=ref, how=base_lock.REGISTRY, identity=locked)
        probe = (
            "import json, sys; from types import SimpleNamespace; "
            "from trainbase.define import base_lock; from trainbase.build import bases; "
            "lock = base_lock.BaseLock(ref=sys.argv[1], how=base_lock.REGISTRY, identity=sys.argv[2]); "
            "print(json.dumps(bases.resolve(lock.ref, SimpleNamespace(bootstrap=None), lock, log=print)))"
        )
        r = subprocess.run(
            [PY, "-c", probe, ref, locked],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=registry.env(),
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        made.append(lock.engine_ref())
        assert json.loads(r.stdout.splitlines()[-1]) == [lock.engine_ref(), None], r.stdout
        (tmp_path / "child").mkdir()
        (tmp_path / "child" / "Dockerfile").write_text(f"FROM {lock.from_ref()}\nLABEL io.trainbase.test.child=1\n")
        child = f"trainbase-test/from-locked-digest:{uuid.uuid4().hex[:8]}"
        docker_("build", "-q", "-t", child, str(tmp_path / "child"))
        made.append(child)
        labels = json.loads(docker_("image", "inspect", "--format", "{{json .Config.Labels}}", child))
        assert labels.get("io.trainbase.test.which") == "locked", labels
    finally:
        for name in reversed(made):  # the child, the pulled base, the pushed variants
            subprocess.run([docker, "image", "rm", "-f", name], capture_output=True, check=False)
