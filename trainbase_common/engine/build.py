"""Images made by the engine itself, without BuildKit (BuildKit builds go through the sibling
`trainbase_common.buildkit`): a small classic build, and a root filesystem tarball imported."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .images import inspect_image
from .sdk import EngineAPIError, EngineError, api_error, call, client


def build_legacy(context: str | Path, ref: str, build_args: dict[str, str], network: str | None = None) -> None:
    """A small build with the engine's classic builder (no BuildKit features needed: the
    conformance self-test's broken variants; ``network``: host, for an engine without a NAT
    bridge). Raises EngineAPIError."""
    import docker

    try:
        client().images.build(
            path=str(context), tag=ref, buildargs=build_args, rm=True, forcerm=True, network_mode=network
        )
    except docker.errors.BuildError as e:
        last = list(e.build_log)[-6:]
        tail = " | ".join(str(x.get("stream") or x.get("error") or "").strip() for x in last)
        raise EngineAPIError(None, f"building {ref} failed: {e.msg}: {tail}") from None
    except docker.errors.APIError as e:
        raise api_error(e) from None


def import_rootfs(tar_path: str | Path, ref: str, changes: Iterable[str] = ()) -> str:
    """`docker import` of a root filesystem tarball under REF; the new image's id."""
    repo, _, t = ref.rpartition(":")
    out = call(client().api.import_image_from_file, str(tar_path), repository=repo, tag=t, changes=list(changes))
    imported = inspect_image(ref)
    if imported is None:
        raise EngineError(f"importing {tar_path} as {ref} left no image: {str(out)[-300:]}")
    return imported.id
