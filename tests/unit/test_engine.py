"""Unit tests for trainbase.engine: pure logic with faked subprocess calls.

No container engine, root or network is needed: every ``subprocess.run`` /
``Popen`` the module makes is replaced by a fake that answers by argv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from trainbase import engine
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from trainbase import engine


# --------------------------------------------------------------------------
# fakes
# --------------------------------------------------------------------------

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
            if cmd[:len(prefix)] == prefix:
                if exc is not None:
                    raise exc
                return subprocess.CompletedProcess(cmd, rc, out, err)
        raise AssertionError(f"unexpected command {cmd}")

    def ran(self, *prefix):
        return [c for c, _ in self.calls if c[:len(prefix)] == list(prefix)]


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path):
    engine._select_client.cache_clear()
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("TRAINBASE_DOCKER", raising=False)
    monkeypatch.setattr(engine.time, "sleep", lambda s: None)
    # Nothing may really be started.
    def no_popen(*a, **k):
        raise AssertionError(f"unexpected Popen {a}")
    monkeypatch.setattr(engine.subprocess, "Popen", no_popen)
    yield
    engine._select_client.cache_clear()


@pytest.fixture
def fake(monkeypatch):
    f = FakeRun()
    monkeypatch.setattr(engine.subprocess, "run", f)
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
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "local" / "bin"),
                                                 str(tmp_path / "usr" / "bin")]))
    monkeypatch.setattr(engine, "_candidate_clients",
                        lambda path_env, _orig=engine._candidate_clients:
                        [c for c in _orig(path_env) if str(tmp_path) in c])
    return new, old


def client_versions(fake, new, old, new_buildx=False, old_buildx=False):
    fake.on([new, "--version"], out="Docker version 28.2.2, build e6534b4\n")
    fake.on([old, "--version"], out="Docker version 20.10.24+dfsg1, build 297e128\n")
    fake.on([new, "buildx", "version"], rc=0 if new_buildx else 1,
            out="github.com/docker/buildx v0.13.1\n" if new_buildx else "",
            err="" if new_buildx else "docker: unknown command: docker buildx\n")
    fake.on([old, "buildx", "version"], rc=0 if old_buildx else 1,
            err="" if old_buildx else "docker: 'buildx' is not a docker command.\n")


# --------------------------------------------------------------------------
# docker client selection
# --------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("Docker version 20.10.24+dfsg1, build 297e128", (20, 10, 24)),
    ("Docker version 28.2.2, build e6534b4", (28, 2, 2)),
    ("20.10.24+dfsg1", (20, 10, 24)),
    ("27.0", (27, 0)),
    ("no version here", None),
    ("", None),
])
def test_parse_version(text, expected):
    assert engine.parse_version(text) == expected


def test_prefers_classic_client_when_no_buildx(fake, two_clients):
    new, old = two_clients
    client_versions(fake, new, old)
    assert engine.docker_cli() == old


def test_prefers_buildx_client_first_on_path(fake, two_clients):
    new, old = two_clients
    client_versions(fake, new, old, new_buildx=True)
    assert engine.docker_cli() == new
    assert not fake.ran(old, "--version")  # buildx wins before versions are read


def test_buildx_on_second_client_beats_classic_first(fake, two_clients):
    new, old = two_clients
    client_versions(fake, new, old, old_buildx=True)
    assert engine.docker_cli() == old


def test_only_new_client_without_buildx_is_an_error(fake, tmp_path, monkeypatch):
    new = make_client(tmp_path / "local")
    monkeypatch.setenv("PATH", str(tmp_path / "local"))
    monkeypatch.setattr(engine, "_candidate_clients",
                        lambda p, _o=engine._candidate_clients: [c for c in _o(p) if str(tmp_path) in c])
    fake.on([new, "buildx", "version"], rc=1, err="unknown command")
    fake.on([new, "--version"], out="Docker version 28.2.2, build e6534b4")
    with pytest.raises(engine.EngineError) as ei:
        engine.docker_cli()
    msg = str(ei.value)
    assert new in msg and "28.2.2" in msg and "buildx" in msg
    assert "docker.io" in msg  # says what to install


def test_too_old_client_is_an_error(fake, tmp_path, monkeypatch):
    old = make_client(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(engine, "_candidate_clients",
                        lambda p, _o=engine._candidate_clients: [c for c in _o(p) if str(tmp_path) in c])
    fake.on([old, "buildx", "version"], rc=1)
    fake.on([old, "--version"], out="Docker version 19.03.15, build 99e3ed8")
    with pytest.raises(engine.EngineError, match="too old"):
        engine.docker_cli()


def test_version_falls_back_to_docker_version_without_engine(fake, tmp_path):
    c = make_client(tmp_path)
    fake.on([c, "--version"], rc=1, err="weird")
    # `docker version` exits 1 when no engine answers but still prints the client part
    fake.on([c, "version"], rc=1, out="22.0.1\n",
            err="Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    assert engine.client_version(c) == (22, 0, 1)


def test_candidates_dedupe_symlinks(tmp_path):
    real = make_client(tmp_path / "usr" / "bin")
    (tmp_path / "bin").symlink_to(tmp_path / "usr" / "bin")
    found = engine._candidate_clients(os.pathsep.join([str(tmp_path / "bin"),
                                                       str(tmp_path / "usr" / "bin")]))
    ours = [c for c in found if str(tmp_path) in c]
    assert len(ours) == 1
    assert os.path.realpath(ours[0]) == os.path.realpath(real)


def test_no_client_at_all(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "_candidate_clients", lambda p: [])
    with pytest.raises(engine.EngineError, match="no docker client found"):
        engine.docker_cli()


def test_override_with_env(monkeypatch, tmp_path, fake):
    c = make_client(tmp_path / "x")
    monkeypatch.setenv("TRAINBASE_DOCKER", c)
    assert engine.docker_cli() == c
    assert fake.calls == []
    monkeypatch.setenv("TRAINBASE_DOCKER", str(tmp_path / "missing"))
    with pytest.raises(engine.EngineError, match="TRAINBASE_DOCKER"):
        engine.docker_cli()


# --------------------------------------------------------------------------
# DOCKER_HOST and engine availability
# --------------------------------------------------------------------------

@pytest.mark.parametrize("host,default", [
    ("", True),
    ("unix:///var/run/docker.sock", True),
    ("unix:///run/docker.sock", True),
    ("unix:///tmp/trainbase-clean/docker.sock", False),
    ("tcp://127.0.0.1:2375", False),
    ("ssh://user@host", False),
])
def test_is_default_host(host, default):
    assert engine.is_default_host(host) is default


@pytest.fixture
def one_client(fake, tmp_path, monkeypatch):
    c = make_client(tmp_path / "bin")
    monkeypatch.setenv("TRAINBASE_DOCKER", c)
    return c


def test_engine_available(fake, one_client):
    fake.on([one_client, "info"], rc=0, out="20.10.24+dfsg1\n")
    assert engine.engine_available() is True
    fake.on([one_client, "info"], rc=1, out="\n", err="Cannot connect to the Docker daemon")
    assert engine.engine_available() is False
    fake.on([one_client, "info"], exc=subprocess.TimeoutExpired(["docker"], 5))
    assert engine.engine_available() is False


def test_engine_available_honours_docker_host(fake, one_client, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/x/docker.sock")
    fake.on([one_client, "info"], rc=0, out="20.10.24\n")
    assert engine.engine_available()
    cmd, kw = fake.ran(one_client, "info")[0], fake.calls[-1][1]
    # the environment (and so DOCKER_HOST) is inherited, never replaced
    assert kw.get("env") is None or kw["env"].get("DOCKER_HOST") == "unix:///tmp/x/docker.sock"
    assert "-H" not in cmd


def test_engine_available_without_client(monkeypatch):
    monkeypatch.setattr(engine, "_client", lambda: None)
    assert engine.engine_available() is False


# --------------------------------------------------------------------------
# ensure_engine
# --------------------------------------------------------------------------

def test_ensure_engine_leaves_running_engine_alone(fake, one_client):
    fake.on([one_client, "info"], out="20.10.24\n")
    fake.on([one_client, "version"], out="20.10.24\n")
    logs = []
    engine.ensure_engine(log=logs.append)
    assert "engine answers" in logs[0]
    assert not fake.ran("apt-get")


def test_ensure_engine_custom_docker_host_is_not_replaced(fake, one_client, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/trainbase-clean/docker.sock")
    fake.on([one_client, "info"], rc=1, err="Cannot connect")
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    with pytest.raises(engine.EngineError) as ei:
        engine.ensure_engine(log=lambda m: None)
    assert "DOCKER_HOST=unix:///tmp/trainbase-clean/docker.sock" in str(ei.value)
    assert "clean-engine.sh" in str(ei.value)
    assert not fake.ran("apt-get")


def test_ensure_engine_needs_root(fake, one_client, monkeypatch):
    fake.on([one_client, "info"], rc=1)
    monkeypatch.setattr(engine.os, "geteuid", lambda: 1000)
    with pytest.raises(engine.EngineError, match="needs root"):
        engine.ensure_engine(log=lambda m: None)


def test_ensure_engine_no_apt(fake, one_client, monkeypatch, tmp_path):
    fake.on([one_client, "info"], rc=1)
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engine, "DOCKERD_PIDFILE", str(tmp_path / "none.pid"))
    monkeypatch.setattr(engine, "_which", lambda name: None)
    with pytest.raises(engine.EngineError, match="not Debian/Ubuntu"):
        engine.ensure_engine(log=lambda m: None)


class FakeProc:
    def __init__(self, exit_code=None, pid=4242):
        self.pid = pid
        self.returncode = exit_code

    def poll(self):
        return self.returncode


def test_ensure_engine_installs_and_starts(fake, one_client, monkeypatch, tmp_path):
    state = {"installed": False, "started": False}
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engine, "DOCKERD_PIDFILE", str(tmp_path / "none.pid"))
    monkeypatch.setattr(engine, "DOCKERD_LOG", str(tmp_path / "dockerd.log"))
    monkeypatch.setattr(engine, "_is_debian_like", lambda: True)
    monkeypatch.setattr(engine, "_which", lambda name: {
        "apt-get": "/usr/bin/apt-get",
        "dockerd": "/usr/sbin/dockerd" if state["installed"] else None}.get(name))
    fake.on(["apt-get", "update"])
    fake.on(["apt-get", "install"])
    fake.on([one_client, "version"], out="20.10.24\n")

    def info(cmd, **kw):
        if cmd[:2] == ["apt-get", "install"]:
            state["installed"] = True
        if cmd[1:2] == ["info"]:
            ok = state["started"]
            return subprocess.CompletedProcess(cmd, 0 if ok else 1, "20.10.24\n" if ok else "", "")
        return FakeRun.__call__(fake, cmd, **kw)
    monkeypatch.setattr(engine.subprocess, "run", info)

    popen_calls = []

    def popen(cmd, **kw):
        popen_calls.append((cmd, kw))
        state["started"] = True
        return FakeProc()
    monkeypatch.setattr(engine.subprocess, "Popen", popen)

    logs = []
    engine.ensure_engine(log=logs.append)
    install = [c for c, kw in fake.calls if c[:2] == ["apt-get", "install"]]
    assert install == [["apt-get", "install", "-y", "docker.io"]]
    env = next(kw["env"] for c, kw in fake.calls if c[:2] == ["apt-get", "install"])
    assert env["DEBIAN_FRONTEND"] == "noninteractive"
    (cmd, kw), = popen_calls
    assert cmd == ["/usr/sbin/dockerd"]
    assert kw["start_new_session"] is True
    assert "DOCKER_HOST" not in kw["env"]
    assert any("answers" in m for m in logs)


def test_ensure_engine_dockerd_exits_early(fake, one_client, monkeypatch, tmp_path):
    log_path = tmp_path / "dockerd.log"
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engine, "DOCKERD_PIDFILE", str(tmp_path / "none.pid"))
    monkeypatch.setattr(engine, "DOCKERD_LOG", str(log_path))
    monkeypatch.setattr(engine, "_which", lambda name: "/usr/sbin/dockerd" if name == "dockerd" else None)
    fake.on([one_client, "info"], rc=1)

    def popen(cmd, stdout=None, **kw):
        stdout.write(b"level=info msg=starting\nfailed to start daemon: pid file found\n")
        stdout.flush()
        return FakeProc(exit_code=1)
    monkeypatch.setattr(engine.subprocess, "Popen", popen)
    with pytest.raises(engine.EngineError) as ei:
        engine.ensure_engine(log=lambda m: None)
    msg = str(ei.value)
    assert "exited with code 1" in msg and "pid file found" in msg and str(log_path) in msg


def test_ensure_engine_timeout_shows_log(fake, one_client, monkeypatch, tmp_path):
    log_path = tmp_path / "dockerd.log"
    log_path.write_text("old run, not ours\n")
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engine, "DOCKERD_PIDFILE", str(tmp_path / "none.pid"))
    monkeypatch.setattr(engine, "DOCKERD_LOG", str(log_path))
    monkeypatch.setattr(engine, "_which", lambda name: "/usr/sbin/dockerd" if name == "dockerd" else None)
    fake.on([one_client, "info"], rc=1)

    def popen(cmd, stdout=None, **kw):
        stdout.write(b"waiting for containerd\n")
        stdout.flush()
        return FakeProc(exit_code=None)
    monkeypatch.setattr(engine.subprocess, "Popen", popen)
    with pytest.raises(engine.EngineError) as ei:
        engine.ensure_engine(log=lambda m: None, timeout=0)
    msg = str(ei.value)
    assert "did not answer within 0 s" in msg and "pid 4242" in msg
    assert "waiting for containerd" in msg and "old run" not in msg


# --------------------------------------------------------------------------
# base images
# --------------------------------------------------------------------------

def test_base_present(fake, one_client):
    fake.on([one_client, "info"], out="20.10.24\n")
    fake.on([one_client, "image", "inspect"], out="sha256:abc\n")
    assert engine.ensure_base_image("debian:12-slim", "bookworm", log=lambda m: None) == "present"
    assert not fake.ran(one_client, "pull")


def test_base_pulled(fake, one_client):
    fake.on([one_client, "info"], out="20.10.24\n")
    fake.on([one_client, "image", "inspect"], rc=1, err="No such image")
    fake.on([one_client, "pull"], out="Status: Downloaded newer image\n")
    assert engine.ensure_base_image("ubuntu:22.04", None, log=lambda m: None) == "pulled"


def test_base_unpullable_without_suite_must_come_from_registry(fake, one_client):
    fake.on([one_client, "info"], out="20.10.24\n")
    fake.on([one_client, "image", "inspect"], rc=1)
    fake.on([one_client, "pull"], rc=1, err="dial tcp: lookup registry-1.docker.io: no such host")
    with pytest.raises(engine.EngineError) as ei:
        engine.ensure_base_image("nvidia/cuda:12.4.1-runtime-ubuntu22.04", None, log=lambda m: None)
    msg = str(ei.value)
    assert "must come from a registry" in msg and "no such host" in msg


def test_base_ubuntu_suite_refused(fake, one_client):
    fake.on([one_client, "info"], out="20.10.24\n")
    fake.on([one_client, "image", "inspect"], rc=1)
    fake.on([one_client, "pull"], rc=1, err="no registry")
    with pytest.raises(engine.EngineError, match="Ubuntu suite.*must come from a registry"):
        engine.ensure_base_image("ubuntu:22.04", "jammy", log=lambda m: None)


def test_pull_timeout_is_false(fake, one_client):
    fake.on([one_client, "pull"], exc=subprocess.TimeoutExpired(["docker", "pull"], 60))
    assert engine.try_pull("debian:12", timeout=60) is False


def test_base_without_engine(fake, one_client):
    fake.on([one_client, "info"], rc=1)
    with pytest.raises(engine.EngineError, match="no container engine answers"):
        engine.ensure_base_image("debian:12", "bookworm", log=lambda m: None)


def test_check_debian_suite(tmp_path, monkeypatch):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sid").write_text("")
    (scripts / "gutsy").write_text("")
    (scripts / "bookworm").symlink_to("sid")
    (scripts / "lunar-ish").symlink_to("gutsy")
    monkeypatch.setattr(engine, "DEBOOTSTRAP_SCRIPTS", scripts)
    assert engine.check_debian_suite("bookworm") is None
    # a Debian codename this debootstrap has no script for: use sid's
    assert engine.check_debian_suite("forky") == str(scripts / "sid")
    with pytest.raises(engine.EngineError, match="not a Debian suite"):
        engine.check_debian_suite("lunar-ish")
    with pytest.raises(engine.EngineError, match="Ubuntu"):
        engine.check_debian_suite("noble")
    with pytest.raises(engine.EngineError, match="unknown suite"):
        engine.check_debian_suite("nosuchsuite")
    with pytest.raises(engine.EngineError, match="invalid suite"):
        engine.check_debian_suite("Bookworm; rm -rf /")


def test_sources_deb822():
    s = engine._sources_deb822("bookworm", "http://deb.debian.org/debian")
    assert "Suites: bookworm bookworm-updates" in s
    assert "URIs: http://deb.debian.org/debian-security" in s
    assert "Suites: bookworm-security" in s
    sid = engine._sources_deb822("sid", "http://deb.debian.org/debian")
    assert "Suites: sid\n" in sid and "security" not in sid
    other = engine._sources_deb822("trixie", "http://mirror.example/debian-mirror")
    assert "security" not in other


@pytest.mark.parametrize("ref,tag", [
    ("debian:12.12-slim", "12.12-slim"),
    ("localhost:5000/debian:12", "12"),
    ("localhost:5000/debian", ""),
    ("debian@sha256:abc", ""),
])
def test_tag_of(ref, tag):
    assert engine._tag_of(ref) == tag


def test_slim_rootfs(tmp_path):
    root = tmp_path / "rootfs"
    files = {
        "usr/share/doc/bash/copyright": "c",
        "usr/share/doc/bash/changelog.gz": "x",
        "usr/share/man/man1/bash.1.gz": "x",
        "usr/share/locale/de/LC_MESSAGES/bash.mo": "x",
        "usr/share/locale/locale.alias": "keep",
        "var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease": "x",
        "var/cache/apt/pkgcache.bin": "x",
        "etc/apt/sources.list": "deb http://deb.debian.org/debian bookworm main\n",
        "etc/resolv.conf": "nameserver 10.0.0.1\n",
        "etc/hostname": "buildhost\n",
        "var/log/bootstrap.log": "x",
        "usr/bin/bash": "x",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "tmp").mkdir()
    (root / "usr/share/doc/sh").symlink_to("/usr/share/doc/dash")  # dangling in the rootfs
    engine.slim_rootfs(str(root), "bookworm", "http://deb.debian.org/debian", slim=True)
    assert (root / "usr/share/doc/bash/copyright").exists()
    assert not (root / "usr/share/doc/bash/changelog.gz").exists()
    assert not (root / "usr/share/man/man1").exists()
    assert not (root / "usr/share/locale/de").exists()
    assert (root / "usr/share/locale/locale.alias").exists()
    assert not (root / "usr/share/doc/sh").is_symlink()
    assert list((root / "var/lib/apt/lists").iterdir()) == []
    assert list((root / "var/cache/apt").iterdir()) == []
    assert not (root / "etc/apt/sources.list").exists()
    assert "bookworm-security" in (root / "etc/apt/sources.list.d/debian.sources").read_text()
    assert (root / "etc/resolv.conf").read_text() == ""
    assert (root / "etc/hostname").read_text() == ""
    assert not (root / "var/log/bootstrap.log").exists()
    assert (root / "usr/bin/bash").exists()
    assert "path-exclude /usr/share/doc/*" in (root / "etc/dpkg/dpkg.cfg.d/docker").read_text()
    assert (root / "etc/apt/apt.conf.d/docker-clean").exists()
    assert os.access(root / "usr/sbin/policy-rc.d", os.X_OK)


def test_not_slim_keeps_docs(tmp_path):
    root = tmp_path / "rootfs"
    (root / "usr/share/doc/bash").mkdir(parents=True)
    (root / "usr/share/doc/bash/changelog.gz").write_text("x")
    engine.slim_rootfs(str(root), "bookworm", "http://deb.debian.org/debian", slim=False)
    assert (root / "usr/share/doc/bash/changelog.gz").exists()
    assert not (root / "etc/dpkg/dpkg.cfg.d/docker").exists()


def test_cli_error_exit_code(monkeypatch, capsys):
    def boom(log=print):
        raise engine.EngineError("no engine here")
    monkeypatch.setattr(engine, "ensure_engine", boom)
    assert engine.main(["ensure"]) == 1
    assert "error: no engine here" in capsys.readouterr().err


def test_ensure_engine_permission_denied(fake, one_client, monkeypatch):
    fake.on([one_client, "info"], rc=1, err="Got permission denied while trying to connect "
            "to the Docker daemon socket at unix:///var/run/docker.sock")
    monkeypatch.setattr(engine.os, "geteuid", lambda: 1000)
    with pytest.raises(engine.EngineError, match="docker group"):
        engine.ensure_engine(log=lambda m: None)
