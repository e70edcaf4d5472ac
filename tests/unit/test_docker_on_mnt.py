"""scripts/ci-docker-on-mnt.sh moves Docker and TMPDIR to /mnt on a GitHub-hosted runner only,
which it tells by GITHUB_ACTIONS and RUNNER_ENVIRONMENT. build-cells.yml runs it under sudo,
whose env_reset drops both: under a plain `sudo bash scripts/ci-docker-on-mnt.sh` it always
said "docker stays where it is", and production cells built on the 20 GB of / instead of /mnt.
Here the workflow step's own `run:` text runs, with the environment a hosted runner gives it,
a sudo that resets the environment as the real one does, a df that shows /mnt roomier than /,
and the script's --dry-run (it stops before touching anything)."""

import os
import shutil
import subprocess

import pytest
import yaml

from .conftest import ROOT

SCRIPT = "scripts/ci-docker-on-mnt.sh"
HOSTED = {"GITHUB_ACTIONS": "true", "RUNNER_ENVIRONMENT": "github-hosted"}

# sudo's env_reset: the command starts with a fresh environment -- PATH (for the fakes here;
# the real sudo puts secure_path there) and what --preserve-env=LIST names -- or, with -E, the
# caller's whole environment
FAKE_SUDO = r"""#!/usr/bin/env bash
keep=("PATH=$PATH")
while [ $# -gt 0 ]; do
  case "$1" in
    --preserve-env=*)
      IFS=, read -ra names <<< "${1#--preserve-env=}"
      for n in "${names[@]}"; do [ -n "${!n+x}" ] && keep+=("$n=${!n}"); done
      shift ;;
    -E|--preserve-env) shift; exec "$@" ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec env -i "${keep[@]}" "$@"
"""


def fake_df(root_gb: int, mnt_gb: int) -> str:
    return f"""#!/usr/bin/env bash
for last; do :; done
case "$last" in /mnt) free={mnt_gb} ;; *) free={root_gb} ;; esac
echo "Filesystem 1G-blocks Used Available Capacity Mounted on"
echo "/dev/x 100G 1G ${{free}}G 1% $last"
"""


@pytest.fixture
def fakes(tmp_path):
    """A bin folder with sudo and df as above (/: 20 GB free, /mnt: 66 GB)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sudo", FAKE_SUDO), ("df", fake_df(20, 66))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def step_run() -> str:
    steps = yaml.safe_load((ROOT / ".github/workflows/build-cells.yml").read_text())["jobs"]["cell"]["steps"]
    [run] = [s["run"] for s in steps if SCRIPT in s.get("run", "")]
    return run


def run_step(run: str, fakes, tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The step's command with --dry-run added, as GitHub runs it (bash -eo pipefail)."""
    assert run.count(SCRIPT) == 1
    github_env = tmp_path / "github_env"
    base = {"PATH": f"{fakes}:/usr/bin:/bin", "GITHUB_ENV": str(github_env), "HOME": str(tmp_path)}
    return subprocess.run(
        [shutil.which("bash"), "-eo", "pipefail", "-c", run.replace(SCRIPT, f"{SCRIPT} --dry-run")],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_workflow_step_hands_the_script_what_tells_a_hosted_runner(fakes, tmp_path):
    proc = run_step(step_run(), fakes, tmp_path, HOSTED)
    assert proc.returncode == 0, proc.stderr
    assert "dry run: would move docker's data root to /mnt/docker" in proc.stderr, proc.stderr
    assert (tmp_path / "github_env").read_text() == ""  # a dry run hands no TMPDIR on


def test_plain_sudo_loses_them_which_is_why_the_step_keeps_them(fakes, tmp_path):
    """The old step: the fake sudo reproduces what the real one did to it."""
    proc = run_step(f'sudo bash {SCRIPT} | tee -a "$GITHUB_ENV"', fakes, tmp_path, HOSTED)
    assert proc.returncode == 0
    assert "docker stays where it is: not a GitHub-hosted runner (GITHUB_ACTIONS=unset" in proc.stderr


@pytest.mark.parametrize(
    ("env", "root_gb", "mnt_gb", "args", "says"),
    [
        (HOSTED, 20, 66, [], "dry run: would move"),
        ({**HOSTED, "RUNNER_ENVIRONMENT": "self-hosted"}, 20, 66, [], "not a GitHub-hosted runner"),
        ({}, 20, 66, [], "not a GitHub-hosted runner (GITHUB_ACTIONS=unset, RUNNER_ENVIRONMENT=unset"),
        (HOSTED, 66, 20, [], "/mnt has no more room than /"),
        ({}, 66, 20, ["--force"], "dry run: would move"),
    ],
)
def test_the_guard(tmp_path, env, root_gb, mnt_gb, args, says):
    (tmp_path / "df").write_text(fake_df(root_gb, mnt_gb))
    (tmp_path / "df").chmod(0o755)
    proc = subprocess.run(
        [shutil.which("bash"), SCRIPT, *args, "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}", **env},
        check=False,
    )
    assert proc.returncode == 0 and says in proc.stderr and proc.stdout == "", proc.stderr


def test_an_unknown_argument_is_refused(tmp_path):
    proc = subprocess.run(
        [shutil.which("bash"), SCRIPT, "--dryrun"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr
