"""The certificate, key and wheel-RECORD readers the hygiene checks apply to an image's layers.
The layers themselves are streamed by trainbase_common.layers (the build's reports read them
too); its names are re-exported here for the checks that import them from this module."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import PurePosixPath

from trainbase_common.layers import LayerFile, LayerScan, scan_layers

__all__ = ["LayerFile", "LayerScan", "has_private_key", "pem_certificates", "record_hashes", "scan_layers",
           "wheel_digest"]

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
            out[str(PurePosixPath(site, parts[0]))] = parts[1][len("sha256="):]
    return out


def wheel_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
