"""An engine that accepts connections and never answers is reported as such within seconds
(issue 64: a run once waited 600 s per call before its first cell, and said nothing)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from trainbase_common import engine
from trainbase_common.engine import sdk


@pytest.fixture
def silent_engine(tmp_path, monkeypatch):
    """A unix socket that accepts every connection and never writes a byte."""
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.setattr(sdk, "ANSWER_S", 1.0)
    sdk._sdk.cache_clear()
    yield path
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()
    sdk._sdk.cache_clear()


def test_a_silent_engine_is_named_within_seconds(silent_engine):
    t0 = time.monotonic()
    with pytest.raises(engine.EngineError) as e:
        engine.client()
    took = time.monotonic() - t0
    assert took < 8, took
    assert "accepted the connection but did not answer within 1 s" in str(e.value)
    assert f"DOCKER_HOST=unix://{silent_engine}" in str(e.value)
    t0 = time.monotonic()
    assert engine.available() is False and time.monotonic() - t0 < 8


def test_no_engine_at_all_is_said_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    sdk._sdk.cache_clear()
    try:
        with pytest.raises(engine.EngineError, match="no Docker engine answers at DOCKER_HOST"):
            engine.client()
    finally:
        sdk._sdk.cache_clear()
