"""The connection to the engine: the docker SDK client for this DOCKER_HOST / DOCKER_CONFIG,
the errors every call of the adapter raises instead of the SDK's, and the engine's own facts
(whether it answers, its version, data root, storage driver and runtimes)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import docker


class EngineError(Exception):
    """The engine (or a docker client for builds) is not usable; the message says why."""


class EngineAPIError(EngineError):
    """The engine answered a request with an error (status: the HTTP status it gave)."""

    def __init__(self, status: int | None, message: str):
        self.status = status
        super().__init__(message)


# Seconds the engine has to answer its first request (the API version the client negotiates).
# An engine that accepts connections and never answers (hung, or a socket some other process
# holds) used to keep a run waiting 600 s per call before its first cell (issue 64).
ANSWER_S = float(os.environ.get("TRAINBASE_ENGINE_ANSWER_S", "10"))
# Seconds one request may take once the engine has answered: an image's export, a long pull.
CALL_S = 600


def _timed_out(e: BaseException) -> bool:
    # by name: requests/urllib3 are the SDK's own dependencies, not this package's
    return type(e).__name__ in ("Timeout", "ReadTimeout", "ConnectTimeout", "ReadTimeoutError") or (
        "timed out" in str(e).lower()
    )


@functools.lru_cache(maxsize=4)
def _sdk(host: str, config: str) -> docker.DockerClient:
    import docker

    where = f" at DOCKER_HOST={host}" if host else ""
    try:
        c = docker.from_env(timeout=int(ANSWER_S) or 1)  # negotiates the API version: one request
    except docker.errors.DockerException as e:
        if _timed_out(e) or _timed_out(e.__cause__ or e.__context__ or e):
            raise EngineError(
                f"the Docker engine{where} accepted the connection but did not answer within {ANSWER_S:g} s "
                "(a hung dockerd? `systemctl status docker`, or its log); TRAINBASE_ENGINE_ANSWER_S sets the wait"
            ) from None
        raise EngineError(f"no Docker engine answers{where}: {e}") from None
    c.api.timeout = CALL_S
    return c


def client() -> docker.DockerClient:
    """The docker SDK client for this DOCKER_HOST / DOCKER_CONFIG (cached per pair)."""
    return _sdk(os.environ.get("DOCKER_HOST", ""), os.environ.get("DOCKER_CONFIG", ""))


def api_error(e: Exception) -> EngineAPIError:
    """The SDK's APIError as this adapter's: its status and its explanation on one line."""
    status = getattr(e, "status_code", None)
    text = " ".join(str(getattr(e, "explanation", None) or e).split())
    return EngineAPIError(status, f"{status} {text}" if status else text)


def call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args, **kw)`` with the SDK's errors turned into EngineError / EngineAPIError."""
    # Any, not fn's own return type: the SDK's overloads (containers.run, exec_start) pick their
    # return type from keyword values this adapter passes in a dict; each caller turns the
    # answer into a typed value (ImageInfo, ExecResult, str).
    import docker

    try:
        return fn(*args, **kw)
    except docker.errors.NotFound as e:
        raise EngineAPIError(404, f"404 {e.explanation or e}") from None
    except docker.errors.APIError as e:
        raise api_error(e) from None
    except (docker.errors.DockerException, OSError) as e:
        raise EngineError(str(e)) from None


def unless_absent(fn: Callable[..., Any], *args: Any, **kw: Any) -> bool:
    """Call; False instead of the error when the engine says 404 (nothing of that name)."""
    try:
        call(fn, *args, **kw)
        return True
    except EngineAPIError as e:
        if e.status != 404:
            raise
        return False


# --------------------------------------------------------------------------- engine facts


def available() -> bool:
    """True when the engine answers a ping."""
    try:
        return bool(call(client().ping))
    except EngineError:
        return False


def server_version() -> str:
    try:
        return str(call(client().version).get("Version", "?"))
    except EngineError:
        return "?"


@dataclass(frozen=True)
class EngineInfo:
    root_dir: str
    driver: str
    runtimes: tuple[str, ...]


def info() -> EngineInfo:
    i = call(client().info)
    return EngineInfo(
        root_dir=i.get("DockerRootDir", ""), driver=i.get("Driver", ""), runtimes=tuple(sorted(i.get("Runtimes") or {}))
    )
