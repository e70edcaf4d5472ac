"""Fixtures for the build tests: the engine, the build report of the images under test, a
loopback registry, and a scratch copy of the repository for deliberately broken builds."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from trainbase import engine

from ..conftest import ROOT, copy_inputs


@pytest.fixture(scope="session")
def docker() -> str:
    if not engine.engine_available():
        pytest.skip("no Docker engine answers (scripts/setup.sh starts one)")
    return engine.docker_cli()


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


@pytest.fixture(scope="session")
def registry(tmp_path_factory, docker) -> str:
    """A real registry (Debian's docker-registry, distribution v2) on 127.0.0.1, for this session."""
    exe = shutil.which("docker-registry")
    if not exe:
        pytest.skip("docker-registry is not installed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("registry")
    port = _free_port()
    cfg = d / "config.yml"
    cfg.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {d / 'data'}}}, delete: {{enabled: false}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=open(d / "registry.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"docker-registry exited: {(d / 'registry.log').read_text()[-500:]}")
            time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)
