"""The build system, for real: what `build.py --matrix` produced, a no-op rebuild, failure
isolation, Ctrl-C, and publishing to a loopback registry (nothing half-published)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from trainbase_common import engine

from ..conftest import cell
from .conftest import ROOT

pytestmark = pytest.mark.engine
PY = sys.executable


def _docker(docker, *args, check=False):
    return subprocess.run([docker, *args], capture_output=True, text=True, check=check)


def _build(cwd, *args, timeout=3600, env=None):
    return subprocess.run(
        [PY, str(ROOT / "build.py"), "--matrix", "--file", str(cwd / "matrix.yaml"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _cli(cwd, *args, env=None):
    """build.py with another action than --matrix (--promote)."""
    return subprocess.run(
        [PY, str(ROOT / "build.py"), "--file", str(cwd / "matrix.yaml"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


def test_every_selected_cell_built_with_both_tags_and_labels(build_report, docker):
    cells = [c for c in build_report["cells"] if c["selected"]]
    assert cells
    for c in cells:
        assert c["status"] in ("built", "cached"), (c["name"], c["status"], c["reason"])
        for ref in (c["image"], c["alias"]):
            assert engine.image_exists(ref), f"{ref} missing"
        labels = engine.inspect_image(c["image"]).labels
        assert labels["io.trainbase.recipe"] == c["recipe"]
        assert labels["org.opencontainers.image.title"] == c["name"]
        assert labels["io.trainbase.nccl"] == c["manifest"]["components"]["nccl"]["version"]
        assert c["size_bytes"] and c["image_id"].startswith("sha256:")
        assert c["log"] is None or os.path.exists(c["log"])


def test_launcher_on_path_and_manifest_in_image(build_report, docker):
    for c in [c for c in build_report["cells"] if c["selected"]]:
        launcher = "mpirun" if c["manifest"]["components"]["mpi"]["kind"] == "openmpi" else "mpiexec"
        r = _docker(
            docker,
            "run",
            "--rm",
            c["image"],
            "bash",
            "-lc",
            f"command -v {launcher} && cat /etc/trainbase/manifest.json",
        )
        assert r.returncode == 0, r.stderr
        path, _, manifest = r.stdout.partition("\n")
        assert path.endswith("/" + launcher)
        assert json.loads(manifest) == c["manifest"]


def test_noop_rebuild_is_served_from_cache(build_report):
    """A second run of the same selection builds nothing: every immutable tag exists."""
    names = [c["name"] for c in build_report["cells"] if c["selected"]]
    t0 = time.monotonic()
    r = _build(ROOT, *sum((["--select", f"name={n}"] for n in names), []), "--report", "/dev/null")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"result: {len(names)} cached" in r.stdout, r.stdout
    cold = sum(c["duration_s"] or 0 for c in build_report["cells"] if c["status"] == "built")
    assert elapsed < 60
    if cold:
        assert elapsed < 0.1 * cold, f"no-op rebuild took {elapsed:.1f}s vs cold {cold:.0f}s"


def test_dry_run_prints_the_plan_without_building(scratch):
    r = _build(scratch, "--profile", "local", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "plan:" in r.stdout and "step 1:" in r.stdout and "step 3:" in r.stdout
    # Every local cell built on another appears with its parent, the deepest ones included
    # (a framework on a framework), read from the listing rather than named here.
    listing = json.loads(_cli(scratch, "--list", "--json").stdout)
    local = [c for c in listing["cells"] if "local" in c["profiles"] and c["parent"]]
    assert any(c["level"] == 2 for c in local), "the local profile has no framework on a framework"
    for c in local:
        assert f"{c['image']}  FROM {c['parent']}" in r.stdout, (c["name"], r.stdout)
    assert "shared os/ib stage (built once)" in r.stdout


def _break_openmpi(scratch):
    """A deliberately failing cell: Open MPI 4.1.4's tarball pinned to a wrong sha256."""
    data = yaml.safe_load((scratch / "matrix.yaml").read_text())
    data["artifacts"]["openmpi-4.1.4-debian"]["sha256"] = "0" * 63 + "f"
    (scratch / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    r = subprocess.run(
        [PY, str(ROOT / "build.py"), "--render", "--file", str(scratch / "matrix.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    listing = json.loads(
        subprocess.run(
            [PY, str(ROOT / "build.py"), "--list", "--json", "--file", str(scratch / "matrix.yaml")],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )
    return {c["name"]: c for c in listing["cells"]}


@pytest.mark.slow
def test_failing_cell_is_isolated_and_publishes_nothing(scratch, registry, docker, build_report):
    cells = _break_openmpi(scratch)
    bad = cell(os="debian12", cuda="12.8", mpi="openmpi4.1.4", framework="none")
    child = cell(os="debian12", cuda="12.8", mpi="openmpi4.1.4", framework="pytorch")
    good = cell(os="debian12", cuda="12.8", mpi="intelmpi2021.18", framework="none")
    report = scratch / "report.json"
    r = _build(
        scratch,
        "--select",
        f"name={bad},{child},{good}",
        "--report",
        str(report),
        "--push",
        "--registry",
        f"{registry.host}/trainbase",
        env=registry.env(),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    rep = {c["name"]: c for c in json.loads(report.read_text())["cells"]}
    assert rep[bad]["status"] == "failed" and "sha256 mismatch" in rep[bad]["reason"]
    assert rep[child]["status"] == "skipped" and bad in rep[child]["reason"]
    assert rep[good]["status"] in ("built", "cached")
    # nothing half-tagged locally, nothing published for the failed cell or its child
    assert not engine.image_exists(cells[bad]["image"])
    for name, state in ((bad, 404), (child, 404), (good, 200)):
        assert registry.status(f"trainbase/{name}", cells[name]["tag"]) == state, name


def _base_cell(build_report):
    """The smallest base cell of the run: the one test_faults' pushes use too (its _small_cell), so
    the session's registry receives one image's layers once -- the engine mounts them into each
    later repository instead of compressing and uploading about 3 GB again (122 s a push here)."""
    return min(
        (c for c in build_report["cells"] if c["selected"] and c["parent"] is None),
        key=lambda c: c.get("size_bytes") or 0,
    )


def test_anonymous_existence_check_is_an_auth_error(registry, docker, build_report, tmp_path):
    """Without a login the registry answers 401, as GHCR/ACR/ECR do: that is an error that says
    how to log in, exit 1, and nothing is pushed -- never "unknown" and a silent skip."""
    c = _base_cell(build_report)
    anonymous = tmp_path / "docker-config"
    anonymous.mkdir()
    r = _build(
        ROOT,
        "--select",
        f"name={c['name']}",
        "--push",
        "--registry",
        f"{registry.host}/trainbase",
        "--report",
        str(tmp_path / "r.json"),
        env=registry.env(logged_in=False, anonymous_config=anonymous),
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"registry {registry.host} refused to say whether" in out and f"docker login {registry.host}" in out, out
    assert json.loads((tmp_path / "r.json").read_text())["publish_error"]
    assert registry.status(f"trainbase/{c['name']}", c["tag"]) == 404


def test_push_stages_the_immutable_tag_and_promotion_moves_the_alias_by_digest(
    registry, docker, build_report, tmp_path
):
    """Logged in (`docker login`, the CLI's credential store): --push stages the immutable tag
    only; --promote with an empty gate holds the cell back (exit 1, no alias), and so does a
    gate that passed it while its SBOM and provenance are not attached (the push's attest step
    "failed": this push had no --sign-key); the next push finds the tag published -- immutable,
    left as is -- and attaches what it lacks; then --promote points `latest` at exactly the
    immutable tag's digest, registry side (skopeo, nothing pushed from the engine); a second
    promote has nothing to do."""
    from .test_registry_side import _keypair

    c = _base_cell(build_report)
    reg = ["--registry", f"{registry.host}/trainbase"]
    key, pub = _keypair(tmp_path, "promote")
    args = ["--select", f"name={c['name']}", "--push", *reg, "--report", "/dev/null"]
    first = _build(ROOT, *args, env=registry.env())
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"pushed {registry.host}/trainbase/{c['name']}:{c['tag']} sha256:" in first.stdout
    repo = f"trainbase/{c['name']}"
    assert registry.tags(repo) == [c["tag"]], "publishing must not move the alias"
    staged = registry.digest(repo, c["tag"])
    gate = tmp_path / "gate"
    gate.mkdir()
    promote = ["--select", f"name={c['name']}", "--promote", *reg, "--public-key", str(pub)]
    held = _cli(ROOT, *promote, "--gate", str(gate), env=registry.env())
    assert (
        held.returncode == 1
        and f"NOT promoted: the gate has no pass for {registry.host}/{repo}@{staged}" in held.stdout
    )
    assert registry.digest(repo, "latest") is None
    ref = f"{registry.host}/{repo}@{staged}"
    # fail closed: the GPU tier's pass alone is not enough while the scan left no record
    (gate / "gpu.json").write_text(json.dumps({"ref": ref, "check": "gpu", "platform": c["platform"], "passed": True}))
    held = _cli(ROOT, *promote, "--gate", str(gate), env=registry.env())
    assert held.returncode == 1 and "missing vulnerability-scan" in held.stdout, held.stdout + held.stderr
    (gate / "scan.json").write_text(json.dumps({"ref": ref, "check": "vulnerability-scan", "passed": True}))
    # every check passed, but nothing is attested: held, and the message says the next build attests it
    held = _cli(ROOT, *promote, "--gate", str(gate), env=registry.env())
    assert held.returncode == 1 and f"NOT promoted: {ref} is not attested" in held.stdout, held.stdout + held.stderr
    assert registry.digest(repo, "latest") is None
    second = _build(ROOT, *args, "--sign-key", str(key), env=registry.env())
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already published (immutable; left as is)" in second.stdout
    assert registry.digest(repo, c["tag"]) == staged, "attaching must not move the immutable tag"
    promoted = _cli(ROOT, *promote, "--gate", str(gate), env=registry.env())
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    assert f"latest -> {staged} (was absent)" in promoted.stdout
    assert registry.digest(repo, "latest") == staged
    again = _cli(ROOT, *promote, env=registry.env())
    assert again.returncode == 0 and f"latest is already {staged}" in again.stdout, again.stdout + again.stderr


def test_parent_is_pulled_from_the_registry_when_the_engine_lacks_it(registry, docker, build_report, tmp_path):
    """What a CI fan-out job does for the parent it builds FROM: the engine does not have the
    recipe's image (both its tags removed, so its own layers go with them), the registry does
    (pushed above): it is pulled with the stored login -- layers and all -- not rebuilt, and
    both local tags come back."""
    c = _base_cell(build_report)
    if registry.status(f"trainbase/{c['name']}", c["tag"]) != 200:
        pushed = _build(
            ROOT,
            "--select",
            f"name={c['name']}",
            "--push",
            "--registry",
            f"{registry.host}/trainbase",
            "--report",
            "/dev/null",
            env=registry.env(),
        )
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    remote = f"{registry.host}/trainbase/{c['name']}:{c['tag']}"
    info = engine.inspect_image(c["image"])
    image_id = info.id
    # every name the image has here: the cell's two, and the loopback registries' (this one's
    # pushes, or an earlier run's); anything else is a name this test does not own
    for ref in [c["alias"], c["image"]] + [t for t in info.raw.get("RepoTags") or [] if t.startswith("127.0.0.1:")]:
        engine.remove_image(ref)
    assert engine.inspect_image(image_id) is None, "the image is still in the engine under another name"
    r = _build(
        ROOT,
        "--select",
        f"name={c['name']}",
        "--registry",
        f"{registry.host}/trainbase",
        "--report",
        str(tmp_path / "r.json"),
        env=registry.env(),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cell = next(x for x in json.loads((tmp_path / "r.json").read_text())["cells"] if x["name"] == c["name"])
    assert cell["status"] == "cached" and cell["reason"] == f"pulled {remote} (same recipe)", cell
    assert engine.inspect_image(c["image"]).id == image_id and engine.image_exists(c["alias"])


def test_push_without_a_registry_argument_is_bad_input(scratch):
    r = _build(scratch, "--profile", "ci", "--push")
    assert r.returncode == 2 and "expected HOST[:PORT]/NAMESPACE" in r.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_cleanly_and_leaves_no_tag(scratch, docker, signum):
    """SIGINT (Ctrl-C) or SIGTERM (a CI runner's cancel, `timeout`, Kubernetes) during a real
    build: exit 128 + the signal (130, 143), the build process is gone, no tag was written, the
    summary says interrupted (issue 64: SIGTERM once died with 143 and nothing said)."""
    block = scratch / "templates" / "blocks" / "intelmpi.j2"
    # a new recipe for the Intel MPI cell (one more RUN), so it really has to build
    # the step prints a marker before it sleeps: BuildKit's step title is cut short for long
    # RUN lines, so the command text itself may never reach the log
    # (a nonce keeps the step out of the build cache: a step that once ran to the end would be
    # cached and never print its marker again)
    marker = f"tb-ctrl-c-point-{uuid.uuid4().hex[:12]}"
    block.write_text(
        block.read_text().replace(" && mpiexec --version", f" && mpiexec --version \\\n && echo {marker} && sleep 600")
    )
    r = subprocess.run(
        [PY, str(ROOT / "build.py"), "--render", "--file", str(scratch / "matrix.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    name = "intelmpi2021.18-cuda12.8-cudnn9-debian12"
    listing = json.loads(
        subprocess.run(
            [
                PY,
                str(ROOT / "build.py"),
                "--list",
                "--json",
                "--select",
                f"name={name}",
                "--file",
                str(scratch / "matrix.yaml"),
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )
    image = listing["cells"][0]["image"]
    assert not engine.image_exists(image)
    proc = subprocess.Popen(
        [
            PY,
            str(ROOT / "build.py"),
            "--matrix",
            "--select",
            f"name={name}",
            "--file",
            str(scratch / "matrix.yaml"),
            "--log-dir",
            str(scratch / "logs"),
        ],
        cwd=scratch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # a shell's background job inherits SIGINT ignored, and Python then
        # never raises KeyboardInterrupt: give the build a Ctrl-C it can hear
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log_dir = scratch / "logs"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # interrupt once the sleep step is running
        logs = list(log_dir.rglob("*.log"))
        if logs and marker in logs[0].read_text():
            break
        if proc.poll() is not None:
            pytest.fail(f"the build ended (exit {proc.returncode}) before its sleep step: {proc.stdout.read()[-1500:]}")
        time.sleep(1)
    else:
        proc.send_signal(signal.SIGINT)  # build.py stops its docker build; kill() would orphan it
        proc.communicate(timeout=120)
        pytest.fail("the build's sleep step never started within 300 s")
    time.sleep(3)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, out
    assert "interrupted" in out
    assert not engine.image_exists(image)
    ps = subprocess.run(["pgrep", "-f", f"docker build .*{name}"], capture_output=True, text=True, check=False)
    assert ps.stdout.strip() == "", "a docker build process survived Ctrl-C"


def test_a_failed_build_with_brackets_in_its_output_gets_its_summary_report_and_exit_code(
    scratch, docker, build_report
):
    """Issue 27: BuildKit's error names the failed command in brackets (`executor failed running
    [/bin/bash -o pipefail -c ...]`) and rich parsed it as markup: the summary crashed, no report
    was written, the exit code was Python's. A real build whose last RUN fails printing
    markup-like text must end in the summary (text verbatim), the report, and exit 1."""
    block = scratch / "templates" / "blocks" / "manifest.j2"
    text = block.read_text()
    last = "RUN tb-doctor --only image.manifest,nccl.library,nccl.shadow,mpi.launcher"
    assert last in text
    noise = "[bold red]boom[/] [/bin/bash -o pipefail] :smile: [link=x]y"
    block.write_text(text.replace(last, f"RUN echo '{noise}' && exit 3"))
    r = subprocess.run(
        [PY, str(ROOT / "build.py"), "--render", "--file", str(scratch / "matrix.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    parent = cell(os="debian12", cuda="12.8", mpi="intelmpi2021.18", framework="none")
    child = cell(os="debian12", cuda="12.8", mpi="intelmpi2021.18", framework="pytorch")
    report = scratch / "reports" / "build.json"
    r = _build(scratch, "--select", f"name={child}", "--no-supply", "--report", str(report), "-j", "1")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "MarkupError" not in out, out[-3000:]
    flat = "".join(out.split())
    assert "executorfailedrunning[/bin/bash-opipefail-cecho'" + "".join(noise.split()) in flat, out[-3000:]
    assert f"skipped because of it (1): {child}" in out and "next: " in out
    rep = {c["name"]: c for c in json.loads(report.read_text())["cells"]}
    assert rep[parent]["status"] == "failed" and rep[parent]["failure_kind"] in ("recipe", "unknown")
    assert rep[parent]["skipped_because_of_this"] == [child]
    assert rep[child]["status"] == "skipped" and parent in rep[child]["reason"]
    assert not engine.image_exists(f"trainbase/{parent}:{rep[parent]['tag']}")
