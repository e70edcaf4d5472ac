"""Images to and from registries, through the engine with the credentials `docker login`
stored: pull, push, and a tag's digest asked of the registry without pulling."""

from __future__ import annotations

import re

from .images import repository
from .sdk import EngineAPIError, EngineError, call, client


def pull(ref: str) -> None:
    """Pull with the stored credentials. Raises EngineAPIError (its status says why). A
    ``name@sha256:...`` reference is pulled by that digest (the API takes it as the tag)."""
    if "@" in ref:
        repo, t = repository(ref), ref.partition("@")[2]
    else:
        repo, _, t = ref.rpartition(":")
    call(client().images.pull, repo, tag=t)


# The registry's HTTP status as the engine (and skopeo) word it inside a message: "unexpected
# status from PUT request to https://...: 403 Forbidden", "received unexpected HTTP status: 500
# Internal Server Error", "unexpected status code 401". Only these say a status: a request id or
# a digest that happens to hold "403" does not (issue 64).
_STATUS = re.compile(
    r"(?i)\b(?:unexpected (?:http )?status(?: code)?(?: from \w+ request to \S+?)?|http status)[:\s]+(\d{3})\b"
)


def registry_status(message: str) -> int | None:
    """The last HTTP status the message says the registry answered, None when it says none."""
    found = _STATUS.findall(message)
    return int(found[-1]) if found else None


def push(ref: str) -> str:
    """Push with the stored credentials; the pushed manifest's digest."""
    repo, _, t = ref.rpartition(":")
    digest = ""
    stream = call(client().images.push, repo, tag=t, stream=True, decode=True)
    try:
        for line in stream:
            if "error" in line or "errorDetail" in line:
                msg = (line.get("errorDetail") or {}).get("message") or line.get("error") or "push failed"
                raise EngineAPIError(registry_status(str(msg)), " ".join(str(msg).split()))
            digest = (line.get("aux") or {}).get("Digest", digest)
    except EngineError:
        raise
    except Exception as e:  # noqa: BLE001 -- the stream itself died (an engine restarted, a timeout)
        # urllib3/requests raise from inside the iteration, past `call`: once a bare traceback
        # after up to 600 s and no report (issue 64); now the push's error, named
        raise EngineError(
            f"the push stream of {ref} stopped: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        ) from None
    if not digest:
        raise EngineAPIError(None, f"pushing {ref} reported no digest")
    return digest


def distribution_digest(ref: str) -> str:
    """The registry's digest for REF, asked through the engine with the stored credentials.
    Raises EngineAPIError: 404 when the tag does not exist, else what the registry said."""
    return str(call(client().api.inspect_distribution, ref)["Descriptor"]["digest"])
