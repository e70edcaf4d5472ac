"""What a failed cell's failure is, decided from what failed, and the next step the summary
names for it.

Four classes, each with its own next step:
- ``environment``: the machine, not the recipe (the emulator of a foreign platform gone, as after
  every reboot; the engine gone; the disk full). Its fix is named; the same command then passes.
- ``transient`` (chance): a network blip, a mirror mid-sync, a process killed by a signal. A
  rerun reuses every cell that completed.
- ``recipe``: a pinned input, a package name, a command in a block, or a supply-chain gate's
  verdict on what the recipe made. A rerun fails the same way.
- ``unknown``: none of these could be told; read the log.

The machine is looked at first, because its faults show up as anything at all in a log (a
container of an arm64 image whose emulator is gone dies at its first exec with an engine error,
which reads like a broken recipe); then the failure's own words are read.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass

from trainbase_common import emulation, engine

TRANSIENT, ENVIRONMENT, RECIPE, UNKNOWN = "transient", "environment", "recipe", "unknown"

# What a failure most likely is, read from the end of its log: a rerun fixes a transient one
# (every cell that completed is reused from cache), not a recipe error.
_TRANSIENT = re.compile(
    r"(?i)exit code: (141|137)\b|\bSIGPIPE\b|Temporary failure (in name resolution|resolving)|Could not resolve|"
    r"Connection (reset|refused|timed out)|timed out|Read timed out|\b50[234]\b.*(Server|Gateway|Unavailable)|"
    r"Hash Sum mismatch|File has unexpected size|TLS handshake timeout|unexpected EOF|IncompleteRead|"
    r"ProtocolError|Network is unreachable|Failed to fetch"
)
_ENVIRONMENT = re.compile(
    r"(?i)no space left on device|Cannot connect to the Docker daemon|permission denied while trying "
    r"to connect|only [\d.]+ GB free"
)
# `\berror: ` and not `error: `: an exception's type name ("EngineAPIError: 409 ...") is not a
# compiler's or apt's "error: " line
_RECIPE = re.compile(
    r"(?i)sha256 mismatch|checksum|THESE PACKAGES DO NOT MATCH THE HASHES|No matching distribution|"
    r"Unable to locate package|\berror: |\bSyntaxError\b|not found"
)
# exception types that are the network's, by name: requests', urllib3's and the standard library's
_NETWORK_ERRORS = {
    "ConnectionError",
    "ConnectionResetError",
    "ConnectionRefusedError",
    "ConnectionAbortedError",
    "TimeoutError",
    "Timeout",
    "ReadTimeout",
    "ConnectTimeout",
    "ReadTimeoutError",
    "ProtocolError",
    "URLError",
    "IncompleteRead",
    "RemoteDisconnected",
    "SSLError",
    "ChunkedEncodingError",
}

NEXT_STEP = {
    TRANSIENT: "this looks transient (network, package mirror, a process killed by a signal): run the same "
    "command again -- every cell that completed is reused from cache, only this one and the cells "
    "skipped because of it are built",
    ENVIRONMENT: "this is the machine, not the recipe: fix it (free disk space with `build.py prune` / "
    "`docker builder prune`, start the engine with scripts/setup.sh), then run the same command again",
    RECIPE: "this is the recipe (a pinned input, a package name, a command in a block): rerunning will fail "
    "the same way; read the log, fix matrix.yaml or the block, `build.py render`, and build again",
    UNKNOWN: "read the log; if the failing step does not fail when run again (a race, a flaky mirror) it is "
    "transient and a rerun reuses every cell that completed",
}


@dataclass(frozen=True)
class Failure:
    kind: str  # TRANSIENT | ENVIRONMENT | RECIPE | UNKNOWN
    cause: str = ""  # what of the machine failed, when that is what it was
    fix: str | None = None  # the step for this cause, where one is known (else NEXT_STEP[kind])


def next_step(kind: str | None, fix: str | None) -> str:
    """The summary's `next:` line: the fix for this very cause where one is known."""
    if fix:
        return (
            f"this is the machine, not the recipe: {fix}; then run the same command again"
            if kind == ENVIRONMENT
            else fix
        )
    return NEXT_STEP[kind or UNKNOWN]


def failure_kind(reason: str, tail: list[str]) -> str:
    """transient | environment | recipe | unknown, from the reason and the end of the log."""
    text = "\n".join([reason, *tail[-60:]])
    if _ENVIRONMENT.search(text):
        return ENVIRONMENT
    if _TRANSIENT.search(text):
        return TRANSIENT
    if _RECIPE.search(text):
        return RECIPE
    return UNKNOWN


def emulator_fault(arch: str) -> Failure | None:
    """A foreign platform's emulator that is not usable now (it was when the run started: the
    run registers it first), else None. Reading /proc costs nothing, so it is always asked."""
    if emulation.is_native(arch):
        return None
    ok, what = emulation.handler_state(arch)
    if ok:
        return None
    return Failure(
        ENVIRONMENT,
        f"this host cannot run {arch} binaries now: {what}",
        f"register the emulator again (the build does it when it starts: run the same command as root), "
        f"or `grep '^:{emulation.QEMU.get(arch, 'qemu-?')}:' /usr/lib/binfmt.d/*.conf > "
        f"{emulation.BINFMT}/register`",
    )


def engine_fault() -> Failure | None:
    if engine.available():
        return None
    return Failure(ENVIRONMENT, "the Docker engine no longer answers", "start it: `bash scripts/setup.sh`")


def classify_exception(e: BaseException, *, arch: str) -> Failure:
    """The class of an exception raised inside a step (the supply chain's inventory runs in a
    container of the image; its SBOM is pushed through the engine)."""
    if isinstance(e, emulation.EmulationError):
        return Failure(ENVIRONMENT, e.cause, e.fix)
    found = emulator_fault(arch)
    if found is not None:
        return found
    if isinstance(e, engine.EngineError):
        found = engine_fault()
        if found is not None:
            return found
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC or re.search(r"(?i)no space left on device", text):
        return Failure(ENVIRONMENT, "the disk is full", "free disk space (`build.py prune`, `docker builder prune`)")
    if any(t.__name__ in _NETWORK_ERRORS for t in type(e).__mro__) or _TRANSIENT.search(text):
        return Failure(TRANSIENT)
    return Failure(UNKNOWN)


def classify_build(reason: str, tail: list[str], *, arch: str) -> Failure:
    """The class of a failed `docker build`: the machine first, then the log's own words."""
    found = emulator_fault(arch)
    if found is not None:
        return found
    kind = failure_kind(reason, tail)
    if kind == ENVIRONMENT and re.search(r"(?i)Cannot connect to the Docker daemon", "\n".join([reason, *tail[-60:]])):
        return engine_fault() or Failure(ENVIRONMENT)
    return Failure(kind)
