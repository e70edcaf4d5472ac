"""Attestations of one pushed image: in-toto Statements about its digest, signed as DSSE
envelopes.

Two statements per image, both with the image's registry digest as subject:
- the SBOM: predicate type ``https://cyclonedx.org/bom``, the predicate is the cell's CycloneDX
  document (the same bytes the image carries at /etc/trainbase/sbom/);
- SLSA provenance v1: what built it (the builder: a GitHub workflow run, or a named machine),
  from what (the recipe hash, the cell, the source revision) and with which inputs, each by
  digest (the base image or bootstrap, every downloaded artifact, every pip lock, patches,
  the parent image), all read from the tag's input lock (inputs.lock.json).

Signing here is with a key (securesystemslib's CryptoSigner: ECDSA P-256 or Ed25519 PEM; the
DSSE envelope is securesystemslib's). In CI the same predicates are signed keyless through
Sigstore with the workflow's OIDC identity (actions/attest, .github/workflows/build-cells.yml);
docs/supply-chain.md says how each is verified."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from securesystemslib.signer import Key, Signer

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
SBOM = "https://cyclonedx.org/bom"
PROVENANCE = "https://slsa.dev/provenance/v1"
PREDICATES = (SBOM, PROVENANCE)
BUILD_TYPE = "https://trainbase.dev/buildtypes/docker-buildkit/v1"
# on each attached artifact: what it states, and which key signed it (so a re-run attaches what
# is missing only, and a verifier can say which key an attestation claims before it checks)
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
KEYID_ANNOTATION = "dev.trainbase.keyid"


class AttestationError(Exception):
    pass


def statement(name: str, digest: str, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    algo, _, hexpart = digest.partition(":")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {algo: hexpart}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def _builder() -> tuple[str, dict[str, Any]]:
    """The builder's id and the run's metadata: the workflow run under GitHub Actions, else
    this machine (a local build is attested as exactly that)."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_WORKFLOW_REF"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        run = f"{server}/{env.get('GITHUB_REPOSITORY', '')}/actions/runs/{env.get('GITHUB_RUN_ID', '')}"
        return f"{server}/{env['GITHUB_WORKFLOW_REF']}", {
            "invocationId": f"{run}/attempts/{env.get('GITHUB_RUN_ATTEMPT', '1')}"
        }
    return f"urn:trainbase:host:{socket.gethostname()}", {}


def _identity_digest(identity: str) -> dict[str, str]:
    """A lock identity (``sha256:...``, ``packages-sha256:...``) as a DigestSet."""
    algo, _, value = identity.rpartition(":")
    return {algo or "sha256": value}


def provenance(cell: str, platform: str, lock: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The SLSA v1 provenance predicate of one built tag, from its input lock and the image's
    OCI labels (source, revision, created)."""
    inputs = lock.get("inputs") or {}
    deps: list[dict[str, Any]] = []
    base = inputs.get("base") or {}
    if base.get("identity"):
        deps.append(
            {
                "name": "base",
                "uri": f"docker://{base.get('ref', '')}",
                "digest": _identity_digest(base["identity"]),
                "annotations": {"how": base.get("how", "")},
            }
        )
    for name, a in sorted((inputs.get("artifacts") or {}).items()):
        deps.append({"name": f"artifact:{name}", "uri": a["url"], "digest": {"sha256": a["sha256"]}})
    for name, src in sorted((inputs.get("sources") or {}).items()):
        deps.append(
            {
                "name": f"source:{name}",
                "uri": f"git+https://github.com/{src['repository']}@{src['commit']}",
                "digest": {"gitCommit": src["commit"], "gitTree": src["tree"]},
            }
        )
    source, revision = (
        labels.get("org.opencontainers.image.source", ""),
        labels.get("org.opencontainers.image.revision", ""),
    )
    for kind in ("pip_locks", "patches"):
        for path, digest in sorted((inputs.get(kind) or {}).items()):
            dep = {"name": f"{kind}:{path}", "digest": {"sha256": digest}}
            if source and revision:
                dep["uri"] = f"git+{source}@{revision}#{path}"
            deps.append(dep)
    if inputs.get("parent_tag"):
        deps.append({"name": "parent", "uri": f"docker://{inputs['parent_tag']}"})
    if source and revision:
        deps.append({"name": "source", "uri": f"git+{source}@{revision}", "digest": {"gitCommit": revision}})
    builder_id, metadata = _builder()
    if labels.get("org.opencontainers.image.created"):
        metadata["finishedOn"] = labels["org.opencontainers.image.created"]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "cell": cell,
                "platform": platform,
                "tag": lock.get("tag", ""),
                "recipe": lock.get("recipe", ""),
                "dockerfile": f"images/{cell}/Dockerfile",
            },
            "resolvedDependencies": deps,
        },
        "runDetails": {"builder": {"id": builder_id}, "metadata": metadata},
    }


# -- keys and envelopes ------------------------------------------------------------------------
def load_signer(path: Path) -> Signer:
    """A signer from a PEM private key (unencrypted PKCS#8: `openssl genpkey -algorithm EC
    -pkeyopt ec_paramgen_curve:P-256`)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        return CryptoSigner(load_pem_private_key(Path(path).read_bytes(), password=None))
    except (OSError, ValueError, TypeError) as e:
        raise AttestationError(f"--sign-key {path}: not a usable PEM private key ({e})") from None


def load_public_key(path: Path) -> Key:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    try:
        return SSlibKey.from_crypto(load_pem_public_key(Path(path).read_bytes()))
    except (OSError, ValueError, TypeError) as e:
        raise AttestationError(f"--public-key {path}: not a usable PEM public key ({e})") from None


def sign(stmt: dict[str, Any], signer: Signer) -> bytes:
    """The DSSE envelope (JSON bytes) of STMT signed by SIGNER."""
    from securesystemslib.dsse import Envelope

    env = Envelope(
        payload=json.dumps(stmt, separators=(",", ":"), sort_keys=True).encode(),
        payload_type=PAYLOAD_TYPE,
        signatures={},
    )
    env.sign(signer)
    return json.dumps(env.to_dict(), separators=(",", ":")).encode()


def verify(envelope: bytes, key: Key, digest: str, predicate_type: str) -> dict[str, Any]:
    """The statement of ENVELOPE after checking, in order: the signature is KEY's, the payload
    is an in-toto Statement, its subject is DIGEST and its predicate type is PREDICATE_TYPE.
    Raises AttestationError naming the first check that failed."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    try:
        env = Envelope.from_dict(json.loads(envelope))
    except (ValueError, KeyError, TypeError) as e:
        raise AttestationError(f"not a DSSE envelope ({e})") from None
    if env.payload_type != PAYLOAD_TYPE:
        raise AttestationError(f"payload type {env.payload_type!r}, expected {PAYLOAD_TYPE}")
    try:
        env.verify([key], 1)
    except VerificationError as e:
        raise AttestationError(f"signature does not verify with key {key.keyid[:12]} ({e})") from None
    try:
        stmt: dict[str, Any] = json.loads(env.payload)
    except ValueError as e:
        raise AttestationError(f"signed payload is not JSON ({e})") from None
    if stmt.get("_type") != STATEMENT_TYPE:
        raise AttestationError(f"signed payload is not an in-toto Statement v1 ({stmt.get('_type')!r})")
    algo, _, hexpart = digest.partition(":")
    if not any(s.get("digest", {}).get(algo) == hexpart for s in stmt.get("subject", [])):
        raise AttestationError(f"signed statement is about {stmt.get('subject')}, not {digest}")
    if stmt.get("predicateType") != predicate_type:
        raise AttestationError(f"signed predicate type {stmt.get('predicateType')!r}, annotated {predicate_type!r}")
    return stmt
