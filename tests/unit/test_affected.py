"""Which cells a diff affects (`build.py --affected REV`, `--ci-matrix --since REV`): sample
diffs applied to a scratch copy of the inputs, the tags rendered before and after compared;
then the same through git, on a scratch repository."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from trainbase.define.matrix import load
from trainbase.deliver import affected
from trainbase.render import recipes

from ..conftest import cell
from .conftest import run_cli


def tags(root: Path) -> dict[str, str]:
    m = load(root / "matrix.yaml")
    return {name: r.tag for name, r in recipes.render_all(m, root=root).items()}


def after(workdir: Path, base: dict[str, str], changed: list[str], problem: str = "") -> affected.Affected:
    m = load(workdir / "matrix.yaml")
    return affected.compare(m, tags(workdir), base, changed, problem)


def descendants(m, names: set[str]) -> set[str]:
    out = set(names)
    grew = True
    while grew:
        more = {c.name for c in m.included if c.parent in out} - out
        out |= more
        grew = bool(more)
    return out


@pytest.mark.parametrize(
    "path,kind",
    [
        ("matrix.yaml", "recipe"),
        ("templates/blocks/nccl.j2", "recipe"),
        ("imagefs/usr/local/bin/tb-fetch", "recipe"),
        ("locks/python-py3.11.txt", "recipe"),
        ("patches/horovod-cxx17.patch", "recipe"),
        ("images/openmpi4.1.4-cuda12.8-cudnn9-debian12/Dockerfile", "recipe"),
        ("trainbase_conformance/checks/test_mpi.py", "suite"),
        ("trainbase_conformance/host.py", "suite"),
        ("examples/pytorch_ddp.py", "suite"),
        ("trainbase/run/executor.py", "tool"),
        ("build.py", "tool"),
        ("requirements.txt", "tool"),
        ("scripts/setup.sh", "tool"),
        ("docs/azureml.md", "none"),
        ("README.md", "none"),
        (".github/workflows/ci.yml", "none"),
        ("tests/unit/test_render.py", "none"),
        # prose beside the suite changes no check (docs/ci.md says "*.md changes nothing"); prose the
        # images carry (imagefs/) is recipe
        ("trainbase_conformance/checks/README.md", "none"),
        ("examples/README.md", "none"),
        ("packaging/conformance/README.md", "none"),
        ("imagefs/opt/trainbase/README.md", "recipe"),
        ("some/new/top-level/thing.txt", "tool"),  # unknown: conservative, and listed
    ],
)
def test_paths_are_classified(path, kind):
    assert affected.classify(path) == kind


def test_a_framework_pin_rebuilds_that_framework_and_the_cells_built_on_it(workdir):
    base = tags(workdir)
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    rel = next(r for r in data["frameworks"]["pytorch"]["releases"] if r["version"] == "2.15.0")
    rel["packages"] = [p if not p.startswith("numpy==") else "numpy==2.4.7" for p in rel["packages"]]
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    a = after(workdir, base, ["matrix.yaml"])
    m = load(workdir / "matrix.yaml")
    torch215 = {c.name for c in m.included if c.framework == "pytorch" and c.framework_version == "2.15.0"}
    assert torch215 and set(a.build) == descendants(m, torch215)
    assert all(m.cell(n).framework != "none" for n in a.build)  # no base cell is rebuilt
    horovod = next(n for n in a.build if n.startswith("horovod"))
    assert a.build[horovod].startswith("its parent pytorch2.15.0-")
    assert set(a.test) == set(a.build)


def test_a_template_block_rebuilds_only_the_cells_that_use_it(workdir):
    base = tags(workdir)
    block = workdir / "templates" / "blocks" / "horovod.j2"
    block.write_text(block.read_text().replace("# --- block: horovod", "# --- block: horovod (edited)", 1))
    a = after(workdir, base, ["templates/blocks/horovod.j2"])
    assert a.build and all(n.startswith("horovod") for n in a.build)
    m = load(workdir / "matrix.yaml")
    assert set(a.build) == {c.name for c in m.included if c.framework == "horovod"}
    assert all(why.startswith("recipe changed (r") for why in a.build.values())


def test_the_image_toolbox_rebuilds_every_cell(workdir):
    base = tags(workdir)
    # a file the image gets (not a __pycache__ a local run of the in-image tools left behind)
    tool = next(p for p in sorted((workdir / "imagefs").rglob("*")) if p.is_file() and "__pycache__" not in p.parts)
    tool.write_text(tool.read_text() + "\n")
    a = after(workdir, base, [str(tool.relative_to(workdir))])
    m = load(workdir / "matrix.yaml")
    assert list(a.build) == [c.name for c in m.included]  # matrix order


def test_a_new_cuda_version_is_new_cells_only(workdir):
    base = tags(workdir)
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    add_cuda(data, "13.3", like="13.2")
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    a = after(workdir, base, ["matrix.yaml"])
    assert a.build and all("cuda13.3" in n for n in a.build)
    assert set(a.build.values()) == {"new cell"}
    assert any(n.startswith("pytorch2.15.0-") for n in a.build)


def add_cuda(data: dict, version: str, like: str) -> None:
    """What a person adds for a new CUDA: the axis value, its table entry, and the framework
    releases whose wheels support it (the NCCL pin kept, so the framework still agrees)."""
    data["axes"]["cuda"].append(version)
    data["cuda"][version] = dict(data["cuda"][like])
    for fw in data["frameworks"].values():
        for rel in fw.get("releases") or []:
            if like in rel.get("cuda", []):
                rel["cuda"].append(version)


def test_docs_only_changes_affect_nothing(workdir):
    base = tags(workdir)
    a = after(workdir, base, ["docs/azureml.md", "README.md", ".github/workflows/build.yml"])
    assert a.build == {} and a.test == {}
    assert a.paths == {"none": ["docs/azureml.md", "README.md", ".github/workflows/build.yml"]}


def test_a_suite_change_retests_every_cell_and_rebuilds_none(workdir):
    base = tags(workdir)
    a = after(workdir, base, ["trainbase_conformance/checks/test_nccl.py"])
    assert a.build == {}
    assert len(a.test) == len(base) and all("conformance suite changed" in w for w in a.test.values())


def test_a_hand_edit_under_images_names_that_cell_and_its_children(workdir):
    base = tags(workdir)
    name = cell(os="debian12", cuda="12.8", mpi="openmpi4.1.4", framework="pytorch")
    a = after(workdir, base, [f"images/{name}/Dockerfile"])
    m = load(workdir / "matrix.yaml")
    assert set(a.build) == descendants(m, {name})
    assert a.build[name] == "its images/ files were edited"


def test_an_unreadable_base_rebuilds_everything(workdir):
    a = after(workdir, None, ["matrix.yaml"], problem="matrix.yaml: axes.gpu: unknown key")
    assert len(a.build) == len(tags(workdir))
    assert all("could not be rendered (matrix.yaml: axes.gpu" in w for w in a.build.values())


def test_removed_cells_are_reported_not_rebuilt(workdir):
    base = tags(workdir)
    data = yaml.safe_load((workdir / "matrix.yaml").read_text())
    # an end-of-life CUDA leaves the matrix: one that no profile names a cell of (found, not named)
    named = " ".join(c for p in data["profiles"].values() for c in p.get("cells") or [])
    gone = next((c for c in reversed(data["axes"]["cuda"]) if f"-cuda{c}-" not in named), data["axes"]["cuda"][-1])
    data["axes"]["cuda"].remove(gone)
    for profile in data["profiles"].values():  # a profile naming its cells lets them go too
        if profile.get("cells"):
            profile["cells"] = [c for c in profile["cells"] if f"-cuda{gone}-" not in c]
            if not profile["cells"]:
                profile.pop("cells")
                profile["select"] = {"framework": ["none"]}
    (workdir / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    a = after(workdir, base, ["matrix.yaml"])
    assert a.build == {}
    assert a.removed and all(f"-cuda{gone}-" in n for n in a.removed)


# -- through git --------------------------------------------------------------------------------------
def git(root: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(workdir: Path) -> Path:
    git(workdir, "init", "-q", "-b", "main")
    git(workdir, "add", "-A")
    git(workdir, "commit", "-qm", "base")
    git(workdir, "checkout", "-qb", "feature")
    return workdir


def test_since_compares_with_the_merge_base_and_sees_uncommitted_files(repo, capsys):
    block = repo / "templates" / "blocks" / "horovod.j2"
    block.write_text(block.read_text().replace("# --- block: horovod", "# --- block: horovod (edited)", 1))
    git(repo, "commit", "-qam", "horovod block")
    git(repo, "checkout", "-q", "main")  # main moves on after the branch left it
    (repo / "docs").mkdir()
    (repo / "docs" / "x.md").write_text("x\n")
    git(repo, "add", "docs")
    git(repo, "commit", "-qm", "docs on main")
    git(repo, "checkout", "-q", "feature")
    (repo / "tests" / "conformance").mkdir(parents=True)
    (repo / "tests" / "conformance" / "test_new.py").write_text("")  # untracked, not committed
    a = affected.since(load(repo / "matrix.yaml"), repo, "main")
    assert a.build and all(n.startswith("horovod") for n in a.build)
    assert a.paths["recipe"] == ["templates/blocks/horovod.j2"]
    assert a.paths["suite"] == ["tests/conformance/test_new.py"]
    assert "none" not in a.paths  # main's own docs commit is not this branch's change
    code, out, _ = run_cli(["--file", str(repo / "matrix.yaml"), "--affected", "main", "--json"], capsys)
    assert code == 0 and json.loads(out)["build"] == a.build
    code, out, _ = run_cli(["--file", str(repo / "matrix.yaml"), "--affected", "main"], capsys)
    assert code == 0 and out.startswith(f"rebuild {len(a.build)} cell(s):\n  horovod")
    assert f"re-test {len(a.test) - len(a.build)} more cell(s) (no rebuild):" in out
    assert "changed recipe paths: templates/blocks/horovod.j2" in out


def test_a_branch_that_changes_nothing_plans_no_job(repo, capsys):
    (repo / "docs").mkdir()
    (repo / "docs" / "new.md").write_text("docs only\n")
    code, out, _ = run_cli(
        ["--file", str(repo / "matrix.yaml"), "--ci-matrix", "--since", "main", "--cover", "--max-levels", "3"], capsys
    )
    assert code == 0
    assert out.splitlines() == ["cells=[]", "count=0", "depth=0", "level0=[]", "level1=[]", "level2=[]", "left_out={}"]


def test_an_unknown_revision_is_bad_input(repo, capsys):
    code, _, err = run_cli(["--file", str(repo / "matrix.yaml"), "--affected", "no-such-branch"], capsys)
    assert code == 2 and "git merge-base no-such-branch HEAD" in err
