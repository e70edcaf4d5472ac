"""The promotion gate fails closed (trainbase/deliver/promote.py): `build.py --promote --gate
DIR` moves `latest` to a digest only with a pass record from every check its cells require --
the GPU tier on each platform of the image, the vulnerability scan -- whatever records happen
to be in DIR. A GPU job that left nothing (expired in the queue with no runner online, a runner
whose python3 is too old for the suite) holds the digest, named with what it lacks; a held
repository holds only itself (issue 52), and every verdict is taken before any alias moves."""

import io
import json

import pytest

from trainbase.define.matrix import load
from trainbase.deliver import attest, promote, registry
from trainbase.deliver.platforms import publishable
from trainbase.render import recipes
from trainbase.supply import vulnscan

from .conftest import ROOT

REGISTRY = "reg.example:5000/tb"


class Registry:
    """What `--promote` asks the registry (registry.digest) and does to it (registry.retag)."""

    def __init__(self):
        self.manifests: dict[str, str] = {}
        self.retags: list[tuple[str, str]] = []

    def digest(self, host, repo, tag):
        return self.manifests.get(f"{host}/{repo}:{tag}")

    def retag(self, src, dst):
        self.retags.append((src, dst))
        self.manifests[dst] = src.split("@")[1]


@pytest.fixture
def reg(monkeypatch):
    r = Registry()
    monkeypatch.setattr(registry, "digest", r.digest)
    monkeypatch.setattr(registry, "retag", r.retag)
    # the attestations' verification is test_delivery's and the loopback registry's (issue 52)
    monkeypatch.setattr(attest, "attestation_check", lambda key, github_repo="": lambda ref: [])
    return r


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "matrix.yaml")


def base_cells(m, n):
    """``n`` single-platform (amd64) base cells of the production profile."""
    return [c for c in m.select(profile="production") if c.parent is None and c.platform == "linux/amd64"][:n]


def publish(reg, m, cells) -> dict[str, str]:
    """Each repository of ``cells`` published under the tag the CI plan publishes it under
    (unpromoted): repository -> its image by digest, what the gate records name."""
    rendered = recipes.render_all(m, cells, root=ROOT)
    refs = {}
    tags = {repo: r.tag for repo, r in publishable(m, rendered, cells).items() if r.tag}
    for i, (repo, tag) in enumerate(tags.items(), start=1):
        reg.manifests[f"{REGISTRY}/{repo}:{tag}"] = digest = "sha256:" + format(i, "064x")
        refs[repo] = f"{REGISTRY}/{repo}@{digest}"
    return refs


def gpu_passed(gate, cell, ref):
    """What gpu.yml's gpu job uploads (artifact gate-CELL) once the tier passed on its platform."""
    (gate / f"gate-{cell.name}").mkdir(parents=True, exist_ok=True)
    (gate / f"gate-{cell.name}" / "gate.json").write_text(
        json.dumps({"ref": ref, "check": "gpu", "platform": cell.platform, "passed": True})
    )


def scanned(gate, cell, ref, passed=True):
    """What gpu.yml's scan job uploads (artifact gate-scan-CELL), pass or fail."""
    (gate / f"gate-scan-{cell.name}").mkdir(parents=True, exist_ok=True)
    (gate / f"gate-scan-{cell.name}" / f"scan-{cell.name}.json").write_text(
        json.dumps({"ref": ref, "check": vulnscan.CHECK, "platform": cell.platform, "passed": passed})
    )


def run(m, cells, gate) -> tuple[int, str]:
    out = io.StringIO()
    return promote.command(m, ROOT, cells, REGISTRY, gate, out), out.getvalue()


def test_a_digest_whose_gpu_job_left_no_record_is_not_promoted(reg, matrix, tmp_path):
    """The fail-open this gate had: with only the scan's record for a digest, the scan was the
    only check "that left a record", so the digest passed and `latest` moved to an image no GPU
    ever ran (checked against the previous promote.py: it exits 0 and retags here)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    [cell] = base_cells(matrix, 1)
    ref = publish(reg, matrix, [cell])[cell.image]
    scanned(gate, cell, ref)
    code, out = run(matrix, [cell], gate)
    assert code == 1 and reg.retags == []
    assert f"{REGISTRY}/{cell.image}:latest" not in reg.manifests
    assert f"{cell.name}: NOT promoted: the gate has no pass for {ref}: missing gpu[linux/amd64]\n" in out
    assert "HELD: 1 repository(ies) stay where they are" in out
    gpu_passed(gate, cell, ref)  # the GPU job ran and passed
    code, out = run(matrix, [cell], gate)
    assert code == 0 and reg.manifests[f"{REGISTRY}/{cell.image}:latest"] == ref.split("@")[1]


def test_gpu_jobs_that_never_ran_hold_every_digest_and_name_the_missing_checks(reg, matrix, tmp_path):
    """Every GPU job expired in the queue (no runner online) and the scan jobs never ran either:
    the gate directory is empty, and that is no pass for anyone."""
    gate = tmp_path / "gate"
    gate.mkdir()
    cells = base_cells(matrix, 3)
    refs = publish(reg, matrix, cells)
    code, out = run(matrix, cells, gate)
    assert code == 1 and reg.retags == []
    for c in cells:
        assert (
            f"{c.name}: NOT promoted: the gate has no pass for {refs[c.image]}: "
            f"missing gpu[linux/amd64], {vulnscan.CHECK}\n"
        ) in out
    assert "promote: 0 promoted, 3 held back" in out


def test_a_multi_arch_index_needs_the_gpu_tier_on_each_of_its_platforms(reg, matrix, tmp_path):
    """One digest, two platforms, each tested on its own GPU runners: the amd64 job's pass says
    nothing about arm64, whose runners (GH200/GB200) may have had none online."""
    gate = tmp_path / "gate"
    gate.mkdir()
    # a Debian twin: the Ubuntu arm64 cells are refused (a pending checksum), in no index
    arm = next(c for c in matrix.included if c.platform == "linux/arm64" and c.os == "debian12")
    amd = next(c for c in matrix.included if c.image == arm.image and c.platform == "linux/amd64")
    ref = publish(reg, matrix, [amd, arm])[amd.image]
    gpu_passed(gate, amd, ref)
    scanned(gate, amd, ref)
    code, out = run(matrix, [amd, arm], gate)
    assert code == 1 and reg.retags == []
    assert (
        f"{amd.image}: NOT promoted: the gate has no pass for {ref}: missing gpu[linux/arm64], "
        f"{vulnscan.CHECK}[linux/arm64]\n"
    ) in out
    gpu_passed(gate, arm, ref)
    scanned(gate, arm, ref)  # each platform's manifest scanned (issue 52)
    code, out = run(matrix, [amd, arm], gate)
    assert code == 0 and reg.manifests[f"{REGISTRY}/{amd.image}:latest"] == ref.split("@")[1]


def test_one_held_cell_holds_only_its_own_repository(reg, matrix, tmp_path):
    """Issue 52: one held cell used to hold the run, so a flaky cell, an offline pool or a new
    critical CVE stalled every promotion, security rebuilds included. Each repository is now
    promoted or held on its own verdict; every verdict is still taken before any alias moves."""
    gate = tmp_path / "gate"
    gate.mkdir()
    good, bad = base_cells(matrix, 2)
    refs = publish(reg, matrix, [good, bad])
    for c in (good, bad):
        gpu_passed(gate, c, refs[c.image])
    scanned(gate, good, refs[good.image])
    scanned(gate, bad, refs[bad.image], passed=False)
    code, out = run(matrix, [good, bad], gate)
    assert code == 1 and reg.retags == [(refs[good.image], f"{REGISTRY}/{good.image}:latest")]
    assert f"{bad.name}: NOT promoted: the gate has no pass for {refs[bad.image]}: failed {vulnscan.CHECK}\n" in out
    assert "promote: 1 promoted, 1 held back" in out


def test_what_a_digest_requires_comes_from_its_cells_not_from_the_records():
    # a multi-arch index: the scan of each platform's manifest (a scanner reads one platform)
    assert promote.required_checks(["linux/arm64", "linux/amd64", "linux/amd64"]) == (
        "gpu[linux/amd64]",
        "gpu[linux/arm64]",
        f"{vulnscan.CHECK}[linux/amd64]",
        f"{vulnscan.CHECK}[linux/arm64]",
    )
    assert promote.required_checks(["linux/amd64"]) == ("gpu[linux/amd64]", vulnscan.CHECK)
    with pytest.raises(ValueError):
        promote.required_checks([])  # a gate that asks nothing would pass anything
