"""Issue 61: what the rendered recipes of the production rows promise, read as a build reads them.

- every Python manager's image asserts the prefix the manifest declares (the conda rows once
  asserted ``sys.prefix == ''`` through a ``$VIRTUAL_ENV`` only the venv row sets);
- one CUDA stack: no image ships a CUDA devel toolkit beside the wheels the frameworks load --
  the toolkit is a compile stage's, and only the UCX / Open MPI prefixes leave it;
- the planned size of each Ubuntu PyTorch image is within 1.5 GB of the Debian one of the same
  CUDA and release;
- labels name what loads: ``io.trainbase.ucx`` is the UCX the MPI links (a wheel's bundled copy
  where it has one), ``io.trainbase.cudnn`` the cuDNN wheel the framework pins.
"""

from __future__ import annotations

import json
import re

import pytest

from trainbase.define.matrix import load
from trainbase.render import recipes

from ..conftest import ROOT
from .conftest import run_cli

# how far an Ubuntu PyTorch image may plan above the Debian one of the same CUDA (issue 61)
UBUNTU_OVER_DEBIAN_GB = 1.5


@pytest.fixture(scope="module")
def rendered() -> dict[str, recipes.Rendered]:
    return recipes.render_all(load(ROOT / "matrix.yaml"), root=ROOT)


def _dockerfile(r: recipes.Rendered) -> str:
    return r.files[f"images/{r.cell.name}/Dockerfile"]


def _manifest(r: recipes.Rendered) -> dict:
    return json.loads(r.files[f"images/{r.cell.name}/manifest.json"])


@pytest.mark.parametrize("manager", ["venv", "conda"])
def test_each_python_manager_asserts_the_prefix_its_manifest_declares(rendered, manager):
    cells = [r for r in rendered.values() if _manifest(r)["components"]["python"]["manager"] == manager]
    assert cells, f"no cell uses python manager {manager}"
    for r in cells:
        prefix = _manifest(r)["components"]["python"]["prefix"]
        text = _dockerfile(r)
        asserted = re.findall(r"assert sys\.prefix == '([^']*)'", text)
        assert asserted == [prefix], f"{r.cell.name}: asserts sys.prefix == {asserted}, manifest says {prefix}"
        # the value is rendered, not read from a variable the row may not set
        assert "'$VIRTUAL_ENV'" not in text, r.cell.name


def test_no_image_stage_ships_a_cuda_devel_toolkit(rendered):
    for r in rendered.values():
        text = _dockerfile(r)
        froms = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, flags=re.M)
        stages = {alias: ref for ref, alias in froms if alias}
        if r.cell.parent:
            continue  # FROM its parent's tag: what the parent ships, checked on the parent
        # the chain of the shipped stage back to an external base
        ref = "image"
        while ref in stages:
            ref = stages[ref]
        assert "devel" not in ref, f"{r.cell.name}: the shipped stage starts FROM {ref}, a CUDA devel image"
        assert "COPY --from=toolchain" not in text, f"{r.cell.name}: copies from the toolchain stage"
        for src, dst in re.findall(r"^COPY --from=(?:ucx|openmpi)-build (\S+) (\S+)$", text, flags=re.M):
            assert src == dst and src in ("/opt/ucx", "/opt/openmpi"), f"{r.cell.name}: COPY {src} {dst}"
        manifest = _manifest(r)
        if manifest["axes"]["os"].startswith("ubuntu"):
            assert manifest["components"]["cuda"]["from"] == "wheels", r.cell.name


def test_cuda_aware_mpi_is_compiled_in_the_toolchain_stage_on_ubuntu(rendered):
    r = rendered["openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04"]
    text = _dockerfile(r)
    assert re.search(r"^FROM nvidia/cuda:12\.8\.1-devel-ubuntu24\.04(@sha256:\w+)? AS toolchain$", text, flags=re.M)
    assert "FROM toolchain AS ucx-build" in text and "FROM toolchain AS openmpi-build" in text
    # UCX's and Open MPI's configure, and the fabric's (libfabric's CUDA support, the NCCL plugin)
    assert text.count("--with-cuda=/usr/local/cuda") == 4
    assert "FROM toolchain AS libfabric-build" in text
    m = _manifest(r)
    assert m["components"]["mpi"]["cuda_aware"] is True
    # and gdr_copy: UCX is built --with-gdrcopy against the image's libgdrapi (the gdrcopy stage)
    assert "FROM os AS gdrcopy-build" in text and "--with-gdrcopy=/opt/gdrcopy" in text
    assert m["components"]["ucx"]["cuda_transports"] == ["cuda_copy", "cuda_ipc", "gdr_copy"]


def test_ubuntu_pytorch_images_plan_within_budget_of_the_debian_ones(rendered):
    debian = {}
    for r in rendered.values():
        m = _manifest(r)
        if r.cell.framework == "pytorch" and m["axes"]["os"] == "debian12" and m["platform"] == "linux/amd64":
            debian[(m["axes"]["cuda"], m["frameworks"]["pytorch"])] = m["size_budget_gb"]
    compared = 0
    for r in rendered.values():
        m = _manifest(r)
        if r.cell.framework != "pytorch" or not m["axes"]["os"].startswith("ubuntu"):
            continue
        key = (m["axes"]["cuda"], m["frameworks"]["pytorch"])
        if key not in debian:
            continue
        compared += 1
        over = m["size_budget_gb"] - debian[key]
        assert over <= UBUNTU_OVER_DEBIAN_GB, (
            f"{r.cell.name}: plans {m['size_budget_gb']} GB, {over:.1f} GB over the Debian image's {debian[key]}"
        )
    assert compared >= 3, "no Ubuntu PyTorch image had a Debian twin to compare with"


def test_labels_name_the_ucx_the_mpi_loads_and_the_cudnn_the_framework_pins(rendered):
    m_all = load(ROOT / "matrix.yaml")
    for r in rendered.values():
        m = _manifest(r)
        labels = recipes.manifest_labels(m)
        mpi = m["components"]["mpi"]
        assert labels["io.trainbase.ucx"] == mpi["ucx"]["version"], r.cell.name
        bundled = m_all.spec.mpi[r.cell.mpi].bundled_ucx
        if bundled:
            assert labels["io.trainbase.ucx"] == bundled, r.cell.name
        cudnn_wheel = m_all.spec.cuda[r.cell.cuda].wheels["cudnn"].version
        assert labels["io.trainbase.cudnn"] == cudnn_wheel, r.cell.name


def test_the_families_profile_covers_each_family_no_registry_free_machine_builds(capsys):
    m = load(ROOT / "matrix.yaml")
    cells = [m.cell(n) for n in m.spec.profiles["families"].cells]
    ubuntu = [c for c in cells if c.os.startswith("ubuntu")]
    assert any(c.framework == "none" and c.ib == "inbox" for c in ubuntu), "no Ubuntu conda base cell"
    assert any(c.framework != "none" for c in ubuntu), "no Ubuntu framework cell"
    assert any(c.ib == "doca" for c in cells), "no DOCA cell"
    code, out, err = run_cli(["build", "--profile", "families", "--dry-run"], capsys)
    assert code == 0, err
    for c in cells:
        assert c.name in out + err


def test_the_pull_request_builds_the_families_on_every_pull_request():
    import yaml

    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    plan = doc["jobs"]["families-plan"]
    assert plan["if"] == "github.event_name == 'pull_request'"
    assert "build.py ci-matrix --profile families" in " ".join(s.get("run", "") for s in plan["steps"])
    job = doc["jobs"]["families"]
    assert job["uses"] == "./.github/workflows/build-cells.yml"
    assert job["with"]["publish"] is False
    assert "if" not in job, "the families are built whatever the pull request changes"
