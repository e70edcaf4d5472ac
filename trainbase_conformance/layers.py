"""The certificate, key, wheel-RECORD and conda-meta readers the hygiene checks apply to an image's layers.
The layers themselves are streamed by trainbase_common.layers (the build's reports read them
too); its names are re-exported here for the checks that import them from this module."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import posixpath
import re
from pathlib import PurePosixPath

from trainbase_common.layers import LayerFile, LayerScan, scan_layers

__all__ = [
    "LayerFile",
    "LayerScan",
    "conda_meta_hashes",
    "has_private_key",
    "pem_certificates",
    "record_hashes",
    "scan_layers",
    "shipped_sha256",
    "wheel_digest",
]

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)
_PEM_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")


def pem_certificates(data: bytes) -> set[str]:
    """SHA-256 fingerprints of the PEM certificates in ``data``."""
    out = set()
    for body in _PEM_CERT.findall(data):
        try:
            out.add(hashlib.sha256(base64.b64decode(b"".join(body.split()))).hexdigest())
        except ValueError:
            continue
    return out


def has_private_key(data: bytes) -> bool:
    return bool(_PEM_KEY.search(data))


def record_hashes(record: bytes, site: str) -> dict[str, str]:
    """A wheel's RECORD: installed path (relative to /) -> urlsafe-b64 sha256."""
    out = {}
    for line in record.decode(errors="replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            out[str(PurePosixPath(site, parts[0]))] = parts[1][len("sha256=") :]
    return out


def wheel_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def conda_meta_hashes(meta: bytes, prefix: str) -> dict[str, set[str]]:
    """A conda package's record (``<prefix>/conda-meta/<pkg>.json``): installed path (relative to
    /) -> the SHA-256s (hex) of the file as the package shipped it and, where conda rewrote its
    install prefix into the file, as installed (``sha256_in_prefix``)."""
    try:
        paths = (json.loads(meta).get("paths_data") or {}).get("paths") or []
    except (ValueError, AttributeError):
        return {}
    out: dict[str, set[str]] = {}
    for p in paths:
        digests = (
            {p[k] for k in ("sha256", "sha256_in_prefix") if isinstance(p.get(k), str)}
            if isinstance(p, dict) and isinstance(p.get("_path"), str)
            else set()
        )
        if digests:
            out.setdefault(posixpath.normpath(posixpath.join(prefix, p["_path"])), set()).update(digests)
    return out


def shipped_sha256(files: list[LayerFile]) -> dict[str, set[str]]:
    """Path (relative to /, normalized) -> the SHA-256s (hex) with which an installed wheel (its
    .dist-info/RECORD) or conda package (conda-meta) shipped it, from the layer files whose
    content was read: a file with one of them is the package's own, byte for byte."""
    out: dict[str, set[str]] = {}
    for f in files:
        if not f.content:
            continue
        if f.path.endswith(".dist-info/RECORD"):
            for path, digest in record_hashes(f.content, posixpath.dirname(posixpath.dirname(f.path))).items():
                with contextlib.suppress(ValueError):
                    raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
                    out.setdefault(posixpath.normpath(path), set()).add(raw.hex())
        elif posixpath.basename(posixpath.dirname(f.path)) == "conda-meta" and f.path.endswith(".json"):
            for path, digests in conda_meta_hashes(f.content, posixpath.dirname(posixpath.dirname(f.path))).items():
                out.setdefault(path, set()).update(digests)
    return out
