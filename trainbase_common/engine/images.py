"""The engine's local images: what an image is (id, size, labels, environment, its build
steps), and its tags (set, listed, removed); how a reference names its repository."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .sdk import EngineAPIError, EngineError, call, client, unless_absent


@dataclass(frozen=True)
class ImageInfo:
    id: str
    size: int
    labels: dict[str, str]
    env: dict[str, str]
    raw: dict[str, Any] = field(repr=False, compare=False)


def inspect_image(ref: str) -> ImageInfo | None:
    """The image's facts, or None when the engine has no such image."""
    try:
        attrs = call(client().api.inspect_image, ref)
    except EngineAPIError as e:
        if e.status == 404:
            return None
        raise
    cfg = attrs.get("Config") or {}
    env = dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e)
    return ImageInfo(
        id=attrs["Id"], size=int(attrs.get("Size", 0)), labels=dict(cfg.get("Labels") or {}), env=env, raw=attrs
    )


def image_exists(ref: str) -> bool:
    try:
        return inspect_image(ref) is not None
    except EngineError:
        return False


def image_history(ref: str) -> list[dict[str, Any]]:
    """`docker history REF`, bottom layer first: [{"created_by": ..., "size": bytes}]
    (metadata steps: 0)."""
    image = call(client().images.get, ref)
    steps = call(image.history)  # the engine lists the newest step first
    return [{"created_by": str(h.get("CreatedBy") or ""), "size": int(h.get("Size") or 0)} for h in reversed(steps)]


def repository(ref: str) -> str:
    """``nvidia/cuda:12.8.1-devel`` -> ``nvidia/cuda``; a digest goes too, and a registry port
    is not a tag (``host:5000/x:1`` -> ``host:5000/x``)."""
    ref = ref.split("@", 1)[0]
    name, _, tag = ref.rpartition(":")
    return name if name and "/" not in tag else ref


def tag(src: str, dst: str) -> None:
    repo, _, t = dst.rpartition(":") if ":" in dst.rsplit("/", 1)[-1] else (dst, "", "latest")
    if not call(client().api.tag, src, repo, t):
        raise EngineError(f"tagging {src} as {dst} failed")


def remove_image(ref: str, force: bool = False) -> bool:
    """Remove a tag (the image goes when its last tag does); False when there was none."""
    return unless_absent(client().api.remove_image, ref, force=force)


def list_tags(reference: str) -> list[str]:
    """Every local REPO:TAG matching a reference filter such as ``trainbase/*``."""
    images = call(client().images.list, filters={"reference": reference})
    return sorted({t for im in images for t in im.tags})
