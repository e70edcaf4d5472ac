"""Fixtures for the build tests: the engine, the build report of the images under test, a
loopback registry, and a scratch copy of the repository for deliberately broken builds."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainbase_common import buildkit, engine

from ..conftest import ROOT, copy_inputs


@pytest.fixture(scope="session")
def docker() -> str:
    if not engine.available():
        pytest.skip("no Docker engine answers (scripts/setup.sh starts one)")
    return buildkit.build_cli()


@pytest.fixture(scope="session")
def build_report(docker) -> dict:
    """The report of the build under test (scripts/test.sh builds the `ci` profile first)."""
    path = os.environ.get("TRAINBASE_BUILD_REPORT", str(ROOT / "reports" / "build.json"))
    if not Path(path).exists():
        pytest.skip(f"no build report at {path}: run `python build.py --matrix --profile ci --report {path}`")
    return json.loads(Path(path).read_text())


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return copy_inputs(tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Registry:
    """A loopback registry that wants a login, and a docker config directory logged in to it."""

    host: str
    user: str
    password: str
    config: Path  # DOCKER_CONFIG with the login (the CLI's credential store)

    def env(self, logged_in: bool = True, anonymous_config: Path | None = None) -> dict[str, str]:
        """The environment of a build.py run: with the stored login, or with an empty config."""
        return {**os.environ, "DOCKER_CONFIG": str(self.config if logged_in else anonymous_config)}

    def status(self, repo: str, tag: str) -> int:
        """HTTP status of HEAD /v2/REPO/manifests/TAG, asked with the registry's credentials."""
        import base64
        import urllib.error
        import urllib.request

        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        req = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/manifests/{tag}",
            method="HEAD",
            headers={
                "Accept": "application/vnd.docker.distribution.manifest.v2+json",
                "Authorization": f"Basic {auth}",
            },
        )
        try:
            return urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as e:
            return e.code

    def digest(self, repo: str, tag: str) -> str | None:
        """Docker-Content-Digest of REPO:TAG (None: absent), asked with the registry's credentials."""
        import base64
        import urllib.error
        import urllib.request

        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        accept = (
            "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.index.v1+json"
        )
        req = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": accept, "Authorization": f"Basic {auth}"},
        )
        try:
            return urllib.request.urlopen(req, timeout=10).headers["Docker-Content-Digest"]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def tags(self, repo: str) -> list[str]:
        import base64
        import urllib.request

        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        req = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/tags/list", headers={"Authorization": f"Basic {auth}"}
        )
        return json.load(urllib.request.urlopen(req, timeout=10))["tags"]


def _htpasswd_line(user: str, password: str) -> str:
    """user:bcrypt(password), what distribution's htpasswd auth reads (glibc's libxcrypt does bcrypt)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    # the registry checks the hash on EVERY request: at crypt's default cost (2^12 rounds) that
    # is ~0.2 s a request, minutes over the delivery weeks; a random password of a loopback
    # registry that lives for one session needs no work factor (2^4, bcrypt's minimum)
    return f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))}\n"  # noqa: S324 -- bcrypt


@pytest.fixture(scope="session")
def registry(tmp_path_factory, docker) -> Registry:
    """A real registry (Debian's docker-registry, distribution v2) on 127.0.0.1 WITH htpasswd
    authentication, as GHCR/ACR/ECR are: every anonymous request gets 401. The session logs in
    with `docker login` into a DOCKER_CONFIG of its own (never the user's)."""
    exe = shutil.which("docker-registry")
    if not exe:
        pytest.skip("docker-registry is not installed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("registry")
    port = _free_port()
    user, password = "trainbase-ci", uuid.uuid4().hex
    (d / "htpasswd").write_text(_htpasswd_line(user, password))
    cfg = d / "config.yml"
    cfg.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {d / 'data'}}}, delete: {{enabled: false}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {{htpasswd: {{realm: trainbase-test, path: {d / 'htpasswd'}}}}}\n"
    )
    with open(d / "registry.log", "w") as log:  # the registry holds its own copy of the descriptor
        proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"docker-registry exited: {(d / 'registry.log').read_text()[-500:]}")
            time.sleep(0.2)
    host = f"127.0.0.1:{port}"
    config = d / "docker-config"
    config.mkdir()
    login = subprocess.run(
        [docker, "--config", str(config), "login", host, "-u", user, "--password-stdin"],
        input=password,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert login.returncode == 0, f"docker login {host} failed: {login.stderr.strip()}"
    _untag_loopback_registries(docker)  # debris of an earlier session killed before its teardown
    yield Registry(host=host, user=user, password=password, config=config)
    proc.terminate()
    proc.wait(timeout=10)
    # the pushes tagged images HOST/...: those names would keep the images (and their layers)
    # alive after the registry is gone, and a later test that removes "every name" of an image
    # would find it still there
    _untag_loopback_registries(docker, host)


def _untag_loopback_registries(docker: str, host: str | None = None) -> None:
    """Remove local tags of this fixture's registry (``host``), or of any loopback registry."""
    listing = subprocess.run(
        [docker, "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.split()
    for ref in listing:
        if ref.startswith(f"{host}/" if host else "127.0.0.1:"):
            engine.remove_image(ref)
