"""Fault injection on the real engine and a real registry (issue 64): each case stops a real run
at a chosen instant -- `kill -9` at a named point (trainbase_common/failpoints.py), a registry
that answers a manifest with a 500 whose body holds "403" -- and ends with a rerun whose end
state must be consistent: the tag, its SBOM layer (the label naming the SBOM its documents
record), `latest`, the documents, the report, the registry's tags.

One small cell: the `ci` profile's Open MPI 5 base, rebuilt in a scratch copy whose recipe
differs by one file in its tools layer (the layers before it come from the build cache; a new
tag, so the supply step and the tagging really run). Cases and their cost on 2 cores: each kill case ~2 minutes (two
supply steps on a 2.6 GB image), the registry case ~1 minute (its blobs are already in the
session registry). SIGINT/SIGTERM during a real build: test_build.py's Ctrl-C test, for both.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainbase_common import engine
from trainbase_common.failpoints import ENV as FAILPOINT

from ..conftest import ROOT, copy_inputs
from .test_build import _build

PY = os.environ.get("TRAINBASE_PYTHON", str(ROOT / ".venv" / "bin" / "python"))


def _small_cell(build_report: dict) -> dict:
    base = [c for c in build_report["cells"] if c["parent"] is None and c["status"] in ("built", "cached")]
    if not base:
        pytest.skip("the build under test has no usable base cell")
    return min(base, key=lambda c: c.get("size_bytes") or 0)


@contextlib.contextmanager
def _new_recipe(where: Path, build_report: dict):
    """A scratch checkout under WHERE whose small cell has a new recipe (one file more in its
    tools layer), rendered: its name, new tag and image reference."""
    cell = _small_cell(build_report)
    (where / "checkout").mkdir()
    scratch = copy_inputs(where / "checkout")
    # a file more in what the image's tools layer COPYs: a new recipe (the tag hashes everything
    # the build reads), and every layer before that COPY comes from the build cache
    (scratch / "imagefs" / "opt" / "trainbase" / "lib" / f"fault-test-{uuid.uuid4().hex[:12]}").write_text("x\n")
    r = subprocess.run(
        [PY, str(ROOT / "build.py"), "render", "--file", str(scratch / "matrix.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    listing = subprocess.run(
        [
            PY,
            str(ROOT / "build.py"),
            "list",
            "--json",
            "--select",
            f"name={cell['name']}",
            "--file",
            str(scratch / "matrix.yaml"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    [row] = json.loads(listing.stdout)["cells"]
    assert row["tag"] != cell["tag"], "the comment must give the cell a new recipe tag"
    try:
        yield scratch, cell["name"], row["tag"], row["image"]
    finally:
        # the engine as the build under test left it: its `latest` on its own tag, no scratch tag
        engine.tag(cell["image"], cell["image"].rsplit(":", 1)[0] + ":latest")
        engine.remove_image(row["image"], force=True)


@pytest.fixture
def recipe(tmp_path, build_report, docker):
    with _new_recipe(tmp_path, build_report) as r:
        yield r


def _documents(scratch: Path, name: str, tag: str) -> Path:
    return scratch / "reports" / "supply" / name / tag


def _sbom_label(image: str) -> str | None:
    info = engine.inspect_image(image)
    return info.labels.get("io.trainbase.sbom.sha256") if info else None


def _latest(image: str) -> str | None:
    info = engine.inspect_image(image.rsplit(":", 1)[0] + ":latest")
    return info.id if info else None


def _consistent(scratch: Path, name: str, tag: str, image: str) -> None:
    """The end state every case must reach: the tag, its documents, its SBOM layer and `latest`
    all describe the same image."""
    docs = _documents(scratch, name, tag)
    lock = json.loads((docs / "inputs.lock.json").read_text())
    assert json.loads((docs / "verdict.json").read_text())["ok"] is True
    assert _sbom_label(image) == lock["outputs"]["sbom_sha256"], "the tag lacks the SBOM its documents record"
    info = engine.inspect_image(image)
    assert info is not None and _latest(image) == info.id, "latest is not the tag"


@pytest.mark.slow
def test_kill_9_between_the_documents_and_the_sbom_layer_is_finished_by_the_rerun(recipe):
    """Before: the four document files said "done", the tag had no SBOM layer, and no rerun
    ever added it (or `latest`); --push then published a tag without its SBOM."""
    scratch, name, tag, image = recipe
    log = ["--select", f"name={name}", "--log-dir", str(scratch / "logs")]
    killed = _build(scratch, *log, env={**os.environ, FAILPOINT: "supply.before-sbom-layer"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    docs = _documents(scratch, name, tag)
    assert (docs / "inputs.lock.json").exists() and (docs / "sbom.cdx.json").exists()
    assert (
        engine.image_exists(image)
        and _sbom_label(image) != json.loads((docs / "inputs.lock.json").read_text())["outputs"]["sbom_sha256"]
    )
    rerun = _build(scratch, *log, "--report", str(scratch / "reports" / "rerun.json"))
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    assert "lacks its SBOM layer" in rerun.stdout, rerun.stdout[-3000:]
    _consistent(scratch, name, tag, image)
    report = json.loads((scratch / "reports" / "rerun.json").read_text())
    assert report["stopped"] is None and {c["name"]: c["status"] for c in report["cells"]}[name] == "cached"


def test_kill_9_before_latest_moves_is_finished_by_the_rerun(recipe):
    """The tag and its documents complete, `latest` not yet moved: the rerun moves it and runs no
    supply step again (nothing else is missing)."""
    scratch, name, tag, image = recipe
    log = ["--select", f"name={name}", "--log-dir", str(scratch / "logs")]
    before = _latest(image)
    killed = _build(scratch, *log, env={**os.environ, FAILPOINT: "build.before-latest"})
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    info = engine.inspect_image(image)
    assert info is not None and _latest(image) == before != info.id
    rerun = _build(scratch, *log)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    assert f"supply: {name}:{tag}" not in rerun.stdout, "a complete tag was documented again"
    _consistent(scratch, name, tag, image)


class _FaultProxy:
    """A registry's front door on another loopback port: passes every request through (bodies
    relayed whole, chunked uploads too), except,
    while ``fail_manifests`` is set, a manifest PUT, answered 500 with a body that holds "403"
    (a request id), as a sick registry backend does."""

    def __init__(self, upstream: str):
        self.upstream, self.fail_manifests, self.failed = upstream, True, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _body(self) -> bytes | None:
                """The request's body, whole: the engine uploads a layer in chunked encoding."""
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    data = bytearray()
                    while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                        data += self.rfile.read(size)
                        self.rfile.readline()  # the chunk's CRLF
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return bytes(data)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _pass(self):
                if proxy.fail_manifests and self.command == "PUT" and "/manifests/" in self.path:
                    body = json.dumps(
                        {"errors": [{"code": "UNKNOWN", "message": "storage backend error, request id 40312-403"}]}
                    ).encode()
                    length = int(self.headers.get("Content-Length") or 0)
                    self.rfile.read(length)
                    proxy.failed += 1
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                data = self._body()
                host, port = proxy.upstream.split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=120)
                # the Host the client asked (the proxy's): the registry's Location headers then
                # point back through the proxy; the body goes on whole, with its length
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("connection", "transfer-encoding", "content-length")
                }
                if data is not None:
                    headers["Content-Length"] = str(len(data))
                conn.request(self.command, self.path, body=data, headers=headers)
                r = conn.getresponse()
                payload = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # a HEAD's Content-Length is the blob's size, not this empty body's: an answer of 0
                # makes the engine take every layer as missing and upload it through the proxy,
                # which relays whole bodies only (the engine then retries its chunked upload forever)
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length if length is not None else str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _seed(registry, repo: str, cell: dict) -> None:
    """The layers put in the repository first, straight to the registry (a mount of the session's
    earlier pushes, or one upload): only the manifest then goes through the proxy, which relays
    whole bodies and not Docker's chunked blob uploads."""
    seed = f"{registry.host}/{repo}/{cell['name']}:seed"
    for argv in (["tag", cell["image"], seed], ["push", seed], ["rmi", seed]):
        r = subprocess.run(["docker", *argv], capture_output=True, text=True, env=registry.env(), check=False)
        assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_a_registry_500_with_403_in_its_body_stops_publishing_and_the_rerun_completes(
    registry, build_report, docker, tmp_path
):
    """Before: a 500 whose body held "403" was told to "log in first"; a push stream that died
    was a urllib3 traceback with no report. Now: "publish: STOPPED" with the registry's words,
    the report written, exit 1, no tag; the rerun through a healthy registry pushes it."""
    cell = _small_cell(build_report)
    proxy = _FaultProxy(registry.host)
    try:
        config = tmp_path / "docker-config"
        config.mkdir()
        env = {**os.environ, "DOCKER_CONFIG": str(config)}
        login = subprocess.run(
            ["docker", "login", proxy.host, "-u", registry.user, "--password-stdin"],
            input=registry.password,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert login.returncode == 0, login.stderr
        repo = f"faults{uuid.uuid4().hex[:8]}"
        _seed(registry, repo, cell)
        report = tmp_path / "push.json"
        args = ["--select", f"name={cell['name']}", "--push", "--registry", f"{proxy.host}/{repo}"]
        stopped = _build(ROOT, *args, "--report", str(report), env=env)
        said = stopped.stdout + stopped.stderr
        assert stopped.returncode == 1 and proxy.failed, said[-3000:]
        assert "publish: STOPPED" in said and "log in first" not in said, said[-3000:]
        doc = json.loads(report.read_text())
        assert doc["publish_error"] and "500" in doc["publish_error"], doc["publish_error"]
        assert registry.digest(f"{repo}/{cell['name']}", cell["tag"]) is None, "a tag was published after a 500"

        proxy.fail_manifests = False
        rerun = _build(ROOT, *args, "--report", str(report), env=env)
        assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
        doc = json.loads(report.read_text())
        pushed = next(c for c in doc["cells"] if c["name"] == cell["name"])
        assert doc["publish_error"] is None and pushed["repo_digest"]
        assert registry.digest(f"{repo}/{cell['name']}", cell["tag"]) == pushed["repo_digest"].rsplit("@", 1)[-1], (
            registry.tags(f"{repo}/{cell['name']}"),
            pushed,
            rerun.stdout[-2500:],
        )
    finally:
        proxy.close()


class _HangingProxy(_FaultProxy):
    """The fault proxy whose manifest PUT never answers (a registry that hangs mid-push): it
    holds the request until released, then answers 500."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.arrived, self.release = threading.Event(), threading.Event()
        self.fail_manifests = False
        proxy = self
        base = self.server.RequestHandlerClass

        class Hang(base):  # type: ignore[misc,valid-type]
            def _pass(self):
                if proxy.hang and self.command == "PUT" and "/manifests/" in self.path:
                    proxy.arrived.set()
                    proxy.release.wait(120)
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                base._pass(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _pass

        self.hang = True
        self.server.RequestHandlerClass = Hang


def _login(host: str, registry, tmp_path: Path) -> dict:
    config = tmp_path / "docker-config"
    config.mkdir(exist_ok=True)
    env = {**os.environ, "DOCKER_CONFIG": str(config)}
    login = subprocess.run(
        ["docker", "login", host, "-u", registry.user, "--password-stdin"],
        input=registry.password,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert login.returncode == 0, login.stderr
    return env


def test_sigterm_while_a_push_waits_on_the_registry_stops_with_143_and_the_rerun_publishes(
    registry, build_report, docker, tmp_path
):
    """Before: SIGTERM during --push died with 143 and no record (or, with the registry hung, a
    urllib3 traceback after 600 s). Now, timed inside a real push -- the manifest PUT sent, the
    registry silent: exit 143 at once, "publish: STOPPED by SIGTERM" in the report, no tag in
    the registry; the rerun through a healthy registry publishes the tag."""
    cell = _small_cell(build_report)
    proxy = _HangingProxy(registry.host)
    try:
        env = _login(proxy.host, registry, tmp_path)
        repo = f"faults{uuid.uuid4().hex[:8]}"
        _seed(registry, repo, cell)
        report = tmp_path / "push.json"
        args = ["--select", f"name={cell['name']}", "--push", "--registry", f"{proxy.host}/{repo}"]
        run = subprocess.Popen(
            [
                PY,
                str(ROOT / "build.py"),
                "--matrix",
                "--file",
                str(ROOT / "matrix.yaml"),
                *args,
                "--report",
                str(report),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proxy.arrived.wait(300), "the push never reached its manifest"
            run.send_signal(signal.SIGTERM)
            said, _ = run.communicate(timeout=60)
        finally:
            proxy.release.set()
            if run.poll() is None:
                run.kill()
        assert run.returncode == 143, said[-3000:]
        assert "interrupted" in said and "SIGTERM" in said, said[-3000:]
        doc = json.loads(report.read_text())
        assert doc["stopped"]["signal"] == "SIGTERM" and doc["stopped"]["stage"] == "publish", doc["stopped"]
        assert doc["publish_error"].startswith("publish: STOPPED by SIGTERM"), doc["publish_error"]
        assert registry.digest(f"{repo}/{cell['name']}", cell["tag"]) is None, "a tag was published after SIGTERM"

        proxy.hang = False
        rerun = _build(ROOT, *args, "--report", str(report), env=env)
        assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
        pushed = next(c for c in json.loads(report.read_text())["cells"] if c["name"] == cell["name"])
        assert registry.digest(f"{repo}/{cell['name']}", cell["tag"]) == pushed["repo_digest"].rsplit("@", 1)[-1]
    finally:
        proxy.close()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 24 MiB tmpfs (root only: `mount`), unmounted after the test."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path, leave: int) -> Path:
    """Fill MNT's file system so that about LEAVE bytes stay free: a real full disk."""
    filler = mnt / "filler"
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        remaining = max(free - leave, 0)
        while remaining > 0:
            n = f.write(chunk[: min(len(chunk), remaining)])
            remaining -= n
        f.flush()
        os.fsync(f.fileno())
    return filler


def test_render_on_a_full_disk_leaves_every_recipe_whole_and_the_next_render_is_clean(small_tmpfs, tmp_path):
    """Before: a full disk under `render` left a truncated Dockerfile that `check` then reported as
    162 drift problems. Now, on a real full tmpfs: one line naming the disk, exit 1, every
    recipe either its old text or its new one (none cut short), no temporary file left; once
    there is room, `render` then `check` pass."""
    (small_tmpfs / "checkout").mkdir()
    (tmp_path / "wanted").mkdir()
    scratch = copy_inputs(small_tmpfs / "checkout")
    wanted = copy_inputs(tmp_path / "wanted")
    # every recipe grows by more than a page: rewritten in place (truncate, then write) on a full
    # disk, each would be cut short -- what the check below must tell apart from a whole file
    grown = "-- DO NOT EDIT. (fault test: " + "x" * 4200 + ")"
    for root in (scratch, wanted):
        t = root / "templates" / "Dockerfile.j2"
        t.write_text(t.read_text().replace("-- DO NOT EDIT.", grown))
    assert (
        subprocess.run(
            [PY, str(ROOT / "build.py"), "render", "--file", str(wanted / "matrix.yaml")], check=False
        ).returncode
        == 0
    )
    old = {p.relative_to(scratch): p.read_bytes() for p in (scratch / "images").rglob("*") if p.is_file()}
    # a rename frees the old file as it lands the new one: the disk is full for a recipe longer
    # than what stays free (the recipes are 6 to 21 KB now)
    filler = _fill(small_tmpfs, leave=12 * 1024)
    r = subprocess.run(
        [PY, str(ROOT / "build.py"), "render", "--file", str(scratch / "matrix.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1 and "No space left on device" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    changed = 0
    for rel, before in old.items():
        now = (scratch / rel).read_bytes()
        assert now in (before, (wanted / rel).read_bytes()), f"{rel} is neither its old text nor its new one"
        changed += now != before
    assert changed < len(old), "the disk was not full: every recipe was rewritten"
    assert not list((scratch / "images").rglob("*.tmp")), "a temporary file was left behind"
    filler.unlink()
    assert (
        subprocess.run(
            [PY, str(ROOT / "build.py"), "render", "--file", str(scratch / "matrix.yaml")], check=False
        ).returncode
        == 0
    )
    check = subprocess.run(
        [PY, str(ROOT / "build.py"), "check", "--file", str(scratch / "matrix.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]


@pytest.mark.slow
def test_a_full_disk_under_the_supply_documents_fails_the_cell_and_the_rerun_completes(
    small_tmpfs, tmp_path, build_report, docker
):
    """The checkout on a real tmpfs with 96 KB left: the image builds, its supply documents (an
    SBOM of ~140 KB) cannot be written. The cell fails naming the full disk, exit 1, `latest` not
    moved, no document says "done"; once there is room, the rerun makes the documents and the
    SBOM layer and moves `latest` -- the consistent end state."""
    with _new_recipe(small_tmpfs, build_report) as (scratch, name, tag, image):
        before = _latest(image)
        args = ["--select", f"name={name}", "--log-dir", str(tmp_path / "logs")]
        # the build's inputs staged before the disk fills (the pinned sources the blocks mount):
        # this test's full disk is the supply documents', written after the image is built
        from trainbase.build import sources
        from trainbase.define.matrix import load

        spec = load(scratch / "matrix.yaml").spec
        _, unstaged = sources.stage_all(spec.sources, [b.source for _, b in spec.fabric if b], scratch)
        assert not unstaged, unstaged
        filler = _fill(small_tmpfs, leave=96 * 1024)
        full = _build(scratch, *args, "--report", str(tmp_path / "full.json"))
        said = full.stdout + full.stderr
        assert full.returncode == 1, said[-3000:]
        assert "No space left on device" in said or "disk" in said.lower(), said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        assert _latest(image) == before, "latest moved to a tag without its documents"
        docs = _documents(scratch, name, tag)
        assert not (docs / "verdict.json").exists() or not json.loads((docs / "verdict.json").read_text())["ok"]
        report = json.loads((tmp_path / "full.json").read_text())
        assert {c["name"]: c["status"] for c in report["cells"]}[name] == "failed", report["cells"]
        filler.unlink()
        rerun = _build(scratch, *args, "--report", str(tmp_path / "rerun.json"))
        assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
        _consistent(scratch, name, tag, image)
