"""The BuildKit build path (trainbase_common.buildkit) without an engine: which docker client can
run BuildKit builds (faked `docker --version` / `buildx version` answers) and the command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from trainbase_common import buildkit
from trainbase_common.engine import EngineError


class FakeRun:
    """Stand-in for subprocess.run: ``rules`` map an argv prefix (after the
    program's basename/path) to (returncode, stdout, stderr) or an exception."""

    def __init__(self):
        self.rules = []
        self.calls = []

    def on(self, argv_prefix, rc=0, out="", err="", exc=None):
        self.rules.insert(0, (list(argv_prefix), rc, out, err, exc))
        return self

    def __call__(self, cmd, **kw):
        cmd = list(cmd)
        self.calls.append((cmd, kw))
        for prefix, rc, out, err, exc in self.rules:
            if cmd[: len(prefix)] == prefix:
                if exc is not None:
                    raise exc
                return subprocess.CompletedProcess(cmd, rc, out, err)
        raise AssertionError(f"unexpected command {cmd}")

    def ran(self, *prefix):
        return [c for c, _ in self.calls if c[: len(prefix)] == list(prefix)]


@pytest.fixture(autouse=True)
def _isolate(monkeypatch):
    buildkit._select_build_cli.cache_clear()
    monkeypatch.delenv("TRAINBASE_DOCKER", raising=False)
    yield
    buildkit._select_build_cli.cache_clear()


@pytest.fixture
def fake(monkeypatch):
    f = FakeRun()
    monkeypatch.setattr(buildkit.subprocess, "run", f)
    return f


def make_client(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / "docker"
    p.write_text("#!/bin/sh\nexit 99\n")
    p.chmod(0o755)
    return str(p)


@pytest.fixture
def two_clients(tmp_path, monkeypatch):
    """/usr/local/bin/docker (28) first on PATH, /usr/bin/docker (20.10) second."""
    new = make_client(tmp_path / "local" / "bin")
    old = make_client(tmp_path / "usr" / "bin")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "local" / "bin"), str(tmp_path / "usr" / "bin")]))
    monkeypatch.setattr(
        buildkit,
        "candidate_clients",
        lambda path_env, _orig=buildkit.candidate_clients: [c for c in _orig(path_env) if str(tmp_path) in c],
    )
    return new, old


def client_versions(fake, new, old, new_buildx=False, old_buildx=False):
    fake.on([new, "--version"], out="Docker version 28.2.2, build e6534b4\n")
    fake.on([old, "--version"], out="Docker version 20.10.24+dfsg1, build 297e128\n")
    fake.on(
        [new, "buildx", "version"],
        rc=0 if new_buildx else 1,
        out="github.com/docker/buildx v0.13.1\n" if new_buildx else "",
        err="" if new_buildx else "docker: unknown command: docker buildx\n",
    )
    fake.on(
        [old, "buildx", "version"],
        rc=0 if old_buildx else 1,
        err="" if old_buildx else "docker: 'buildx' is not a docker command.\n",
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Docker version 20.10.24+dfsg1, build 297e128", (20, 10, 24)),
        ("Docker version 28.2.2, build e6534b4", (28, 2, 2)),
        ("20.10.24+dfsg1", (20, 10, 24)),
        ("27.0", (27, 0)),
        ("no version here", None),
        ("", None),
    ],
)
def test_parse_version(text, expected):
    assert buildkit.parse_version(text) == expected


def test_prefers_classic_client_when_no_buildx(fake, two_clients):
    new, old = two_clients
    client_versions(fake, new, old)
    assert buildkit.build_cli() == old


def test_prefers_buildx_client_first_on_path(fake, two_clients):
    new, old = two_clients
    client_versions(fake, new, old, new_buildx=True)
    assert buildkit.build_cli() == new
    assert not fake.ran(old, "--version")  # buildx wins before versions are read


def test_buildx_on_second_client_beats_classic_first(fake, two_clients):
    new, old = two_clients
    client_versions(fake, new, old, old_buildx=True)
    assert buildkit.build_cli() == old


def test_only_new_client_without_buildx_is_an_error(fake, tmp_path, monkeypatch):
    new = make_client(tmp_path / "local")
    monkeypatch.setenv("PATH", str(tmp_path / "local"))
    monkeypatch.setattr(
        buildkit, "candidate_clients", lambda p, _o=buildkit.candidate_clients: [c for c in _o(p) if str(tmp_path) in c]
    )
    fake.on([new, "buildx", "version"], rc=1, err="unknown command")
    fake.on([new, "--version"], out="Docker version 28.2.2, build e6534b4")
    with pytest.raises(EngineError) as ei:
        buildkit.build_cli()
    msg = str(ei.value)
    assert new in msg and "28.2.2" in msg and "buildx" in msg
    assert "docker.io" in msg  # says what to install


def test_too_old_client_is_an_error(fake, tmp_path, monkeypatch):
    old = make_client(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(
        buildkit, "candidate_clients", lambda p, _o=buildkit.candidate_clients: [c for c in _o(p) if str(tmp_path) in c]
    )
    fake.on([old, "buildx", "version"], rc=1)
    fake.on([old, "--version"], out="Docker version 19.03.15, build 99e3ed8")
    with pytest.raises(EngineError, match="too old"):
        buildkit.build_cli()


def test_candidates_dedupe_symlinks(tmp_path):
    real = make_client(tmp_path / "usr" / "bin")
    (tmp_path / "bin").symlink_to(tmp_path / "usr" / "bin")
    found = buildkit.candidate_clients(os.pathsep.join([str(tmp_path / "bin"), str(tmp_path / "usr" / "bin")]))
    ours = [c for c in found if str(tmp_path) in c]
    assert len(ours) == 1
    assert os.path.realpath(ours[0]) == os.path.realpath(real)


def test_no_client_at_all(monkeypatch, tmp_path):
    monkeypatch.setattr(buildkit, "candidate_clients", lambda p: [])
    with pytest.raises(EngineError, match="no docker client found"):
        buildkit.build_cli()


def test_override_with_env(monkeypatch, tmp_path, fake):
    c = make_client(tmp_path / "x")
    monkeypatch.setenv("TRAINBASE_DOCKER", c)
    assert buildkit.build_cli() == c
    assert fake.calls == []
    monkeypatch.setenv("TRAINBASE_DOCKER", str(tmp_path / "missing"))
    with pytest.raises(EngineError, match="TRAINBASE_DOCKER"):
        buildkit.build_cli()


def test_build_command_is_a_buildkit_build_that_tags_only_at_the_end(monkeypatch):
    monkeypatch.setenv("TRAINBASE_DOCKER", "/bin/sh")  # any executable
    cmd, env = buildkit.build_command(
        "images/x/Dockerfile",
        "ns/x:r1",
        labels={"a": "1"},
        build_args={"B": "2"},
        target="image",
        secrets={"ca_bundle": "/ca.pem"},
        network="host",
    )
    assert env["DOCKER_BUILDKIT"] == "1" and cmd[:3] == ["/bin/sh", "build", "--progress=plain"]
    assert cmd[cmd.index("-t") + 1] == "ns/x:r1" and cmd[-1] == "."
    assert cmd[cmd.index("--secret") : cmd.index("--secret") + 2] == ["--secret", "id=ca_bundle,src=/ca.pem"]
    assert cmd[cmd.index("--label") : cmd.index("--label") + 2] == ["--label", "a=1"]


def test_images_say_where_their_recipe_lives_without_leaking_a_token(tmp_path, monkeypatch):
    """OCI source/revision/created labels: the repository URL without credentials, the commit,
    the time; CI's own repository and SHA where GitHub sets them."""
    import subprocess

    from trainbase.build import docker_build

    for k in ("GITHUB_REPOSITORY", "GITHUB_SHA", "GITHUB_SERVER_URL"):
        monkeypatch.delenv(k, raising=False)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(tmp_path),
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    subprocess.run(
        [
            "git",
            "-C",
            str(tmp_path),
            "remote",
            "add",
            "origin",
            "https://x-access-token:ghs_SECRET@github.com/org/trainbase.git",
        ],
        check=True,
    )
    docker_build.source_labels.cache_clear()
    got = docker_build.source_labels(str(tmp_path))
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    assert got["org.opencontainers.image.source"] == "https://github.com/org/trainbase.git"
    assert got["org.opencontainers.image.revision"] == head and got["org.opencontainers.image.created"].endswith("Z")
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/trainbase")
    monkeypatch.setenv("GITHUB_SHA", "f" * 40)
    docker_build.source_labels.cache_clear()
    got = docker_build.source_labels(str(tmp_path))
    assert got["org.opencontainers.image.source"] == "https://github.com/org/trainbase"
    assert got["org.opencontainers.image.revision"] == "f" * 40
    docker_build.source_labels.cache_clear()
