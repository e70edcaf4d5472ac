"""Images to and from registries, through the engine with the credentials `docker login`
stored: pull, push, and a tag's digest asked of the registry without pulling."""

from __future__ import annotations

import re

from .images import repository
from .sdk import EngineAPIError, call, client


def pull(ref: str) -> None:
    """Pull with the stored credentials. Raises EngineAPIError (its status says why). A
    ``name@sha256:...`` reference is pulled by that digest (the API takes it as the tag)."""
    if "@" in ref:
        repo, t = repository(ref), ref.partition("@")[2]
    else:
        repo, _, t = ref.rpartition(":")
    call(client().images.pull, repo, tag=t)


def push(ref: str) -> str:
    """Push with the stored credentials; the pushed manifest's digest."""
    repo, _, t = ref.rpartition(":")
    digest = ""
    for line in call(client().images.push, repo, tag=t, stream=True, decode=True):
        if "error" in line or "errorDetail" in line:
            msg = (line.get("errorDetail") or {}).get("message") or line.get("error") or "push failed"
            m = re.search(r"\b(401|403)\b", msg)
            raise EngineAPIError(int(m.group(1)) if m else None, " ".join(str(msg).split()))
        digest = (line.get("aux") or {}).get("Digest", digest)
    if not digest:
        raise EngineAPIError(None, f"pushing {ref} reported no digest")
    return digest


def distribution_digest(ref: str) -> str:
    """The registry's digest for REF, asked through the engine with the stored credentials.
    Raises EngineAPIError: 404 when the tag does not exist, else what the registry said."""
    return str(call(client().api.inspect_distribution, ref)["Descriptor"]["digest"])
