"""OCI 1.1 referrers: artifacts (signed SBOMs, provenance) attached to an image digest in the
registry, and the list of what is attached to a digest.

An attachment is an OCI image manifest whose ``subject`` is the image's manifest descriptor
and whose ``artifactType`` says what it is (distribution-spec 1.1). Registries that serve the
referrers API (`GET /v2/<name>/referrers/<digest>`: GHCR, ACR, ECR, Docker Hub, distribution
3) index such manifests themselves and say so with the ``OCI-Subject`` header on the manifest
PUT. Registries that do not (distribution 2.8, which is Debian's docker-registry and what the
loopback tests run) get the spec's fallback: an image index under the tag
``sha256-<subject hex>`` listing the attached manifests, which this client keeps up to date.
cosign, oras and `gh attestation` read both.

Transport and authentication are oras-py's (`oras.provider.Registry`: the credentials `docker
login` stored, credential helpers, Basic or Bearer challenges); what oras-py does not do --
subjects with a digest of the exact bytes sent, artifactType, the referrers API and its
fallback -- is here."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .registry import RegistryAuthError, RegistryError, _loopback, login_hint

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fallback_tag(digest: str) -> str:
    """The referrers tag schema: ``sha256:abc...`` -> ``sha256-abc...``."""
    algo, _, hexpart = digest.partition(":")
    return f"{algo}-{hexpart}"


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    artifact_type: str = ""
    annotations: tuple[tuple[str, str], ...] = ()

    def as_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            d["artifactType"] = self.artifact_type
        if self.annotations:
            d["annotations"] = dict(self.annotations)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Descriptor:
        return cls(
            d["mediaType"],
            d["digest"],
            int(d["size"]),
            d.get("artifactType", ""),
            tuple(sorted((d.get("annotations") or {}).items())),
        )


class Client:
    """One registry host, with the stored credentials (DOCKER_CONFIG honoured)."""

    def __init__(self, host: str):
        import oras.container
        import oras.provider

        self.host = host
        self.prefix = "http" if _loopback(host) else "https"
        # Docker Hub's name is not where its API answers (what the engine and skopeo map too)
        self.api = "registry-1.docker.io" if host in ("docker.io", "index.docker.io") else host
        probe = self._session_less_get(f"{self.prefix}://{self.api}/v2/")
        # distribution's htpasswd realm and ECR challenge with Basic; GHCR, ACR, Docker Hub with Bearer
        backend = "basic" if probe.lower().startswith("basic") else "token"
        self.oras = oras.provider.Registry(hostname=self.api, insecure=self.prefix == "http", auth_backend=backend)
        config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
        self.oras.auth.load_configs(
            oras.container.Container(f"{host}/any"), configs=[str(config)] if config.exists() else None
        )
        if self.api == "registry-1.docker.io" and not getattr(self.oras.auth, "_basic_auth", None):
            self.oras.auth._load_auth("https://index.docker.io/v1/")  # where `docker login` files Docker Hub
        # no stored credentials for a Basic registry: ask anonymously and report its 401, rather
        # than let oras-py's retry loop sleep through minutes of back-off on its missing secret
        self.anonymous = backend == "basic" and not getattr(self.oras.auth, "_basic_auth", None)

    def _session_less_get(self, url: str) -> str:
        import requests

        try:
            return requests.get(url, timeout=30).headers.get("Www-Authenticate", "")
        except requests.RequestException as e:
            raise RegistryError(f"registry {self.host} cannot be reached: {e}") from None

    def _request(self, method: str, path: str, what: str, ok: tuple[int, ...], **kw: Any) -> Any:  # requests.Response
        """PATH under /v2/ (or an absolute URL the registry handed out: an upload's Location)."""
        import requests

        try:
            url = path if path.startswith(("http://", "https://")) else f"{self.prefix}://{self.api}/v2/{path}"
            r = (
                self.oras.session.request(method, url, timeout=300, **kw)
                if self.anonymous
                else self.oras.do_request(url, method, **kw)
            )
        except (requests.RequestException, ValueError) as e:
            raise RegistryError(f"registry {self.host} could not {what}: {e}") from None
        if r.status_code in (401, 403):
            raise RegistryAuthError(
                f"registry {self.host} refused to {what} (HTTP {r.status_code}): log in first "
                f"with {login_hint(self.host)}"
            )
        if r.status_code not in ok:
            raise RegistryError(f"registry {self.host} could not {what}: HTTP {r.status_code} {r.text[:300]}")
        return r

    # -- content ---------------------------------------------------------------------------------
    def manifest(self, repo: str, ref: str) -> tuple[bytes, str] | None:
        """(the manifest's exact bytes, its media type), or None when REF does not exist."""
        r = self._request(
            "GET", f"{repo}/manifests/{ref}", f"serve {repo}:{ref}", (200, 404), headers={"Accept": ACCEPT}
        )
        if r.status_code == 404:
            return None
        return r.content, r.headers.get("Content-Type", "").split(";")[0] or json.loads(r.content).get("mediaType", "")

    def descriptor(self, repo: str, ref: str) -> Descriptor:
        got = self.manifest(repo, ref)
        if got is None:
            raise RegistryError(f"registry {self.host} has no {repo}:{ref}")
        data, media_type = got
        return Descriptor(media_type, sha256(data), len(data))

    def blob(self, repo: str, digest: str) -> bytes:
        data: bytes = self._request("GET", f"{repo}/blobs/{digest}", f"serve blob {digest} of {repo}", (200,)).content
        if sha256(data) != digest:
            raise RegistryError(f"registry {self.host}: blob {digest} of {repo} does not have its digest")
        return data

    def put_blob(self, repo: str, data: bytes, media_type: str) -> Descriptor:
        desc = Descriptor(media_type, sha256(data), len(data))
        with tempfile.NamedTemporaryFile(prefix="trainbase-blob-") as f:
            f.write(data)
            f.flush()
            self._upload(repo, f.name, desc)
        return desc

    def copy_blob(self, src_repo: str, dst_repo: str, digest: str) -> None:
        """Make blob DIGEST of SRC_REPO present in DST_REPO, this registry: already there, or
        mounted across repositories (no byte moves), or -- where the registry declines the
        mount and opens an upload instead -- streamed through this process in 8 MiB chunks
        (a CUDA layer is gigabytes: never held in memory)."""
        if (
            self._request(
                "HEAD", f"{dst_repo}/blobs/{digest}", f"say whether {dst_repo} has {digest}", (200, 404)
            ).status_code
            == 200
        ):
            return
        r = self._request(
            "POST",
            f"{dst_repo}/blobs/uploads/?mount={digest}&from={src_repo}",
            f"mount {digest} of {src_repo} into {dst_repo}",
            (201, 202),
        )
        if r.status_code == 201:
            return
        # declined: the registry opened an upload session instead (left to lapse). The blob is
        # spooled to a temporary file and uploaded as put_blob does: a request body read from a
        # stream could not be re-sent when the registry asks for a new token half way
        src = self._request(
            "GET", f"{src_repo}/blobs/{digest}", f"serve blob {digest} of {src_repo}", (200,), stream=True
        )
        h = hashlib.sha256()
        with tempfile.NamedTemporaryFile(prefix="trainbase-blob-", dir=os.environ.get("TMPDIR") or "/var/tmp") as f:  # noqa: S108 -- tempfile picks the private name
            for chunk in src.iter_content(8 << 20):
                h.update(chunk)
                f.write(chunk)
            f.flush()
            if f"sha256:{h.hexdigest()}" != digest:
                raise RegistryError(f"registry {self.host}: blob {digest} of {src_repo} does not have its digest")
            self._upload(dst_repo, f.name, Descriptor("application/octet-stream", digest, f.tell()))

    def _upload(self, repo: str, path: str, desc: Descriptor) -> None:
        import oras.container

        r = self.oras.upload_blob(path, oras.container.Container(f"{self.api}/{repo}"), desc.as_json())
        if r.status_code not in (200, 201, 202):
            raise RegistryError(
                f"registry {self.host} did not take blob {desc.digest} into {repo}: HTTP {r.status_code} {r.text[:300]}"
            )

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> Any:  # requests.Response
        return self._request(
            "PUT",
            f"{repo}/manifests/{ref}",
            f"accept a manifest as {repo}:{ref}",
            (201,),
            data=data,
            headers={"Content-Type": media_type},
        )

    # -- referrers -------------------------------------------------------------------------------
    def attach(
        self,
        repo: str,
        subject: Descriptor,
        artifact_type: str,
        payload: bytes,
        payload_media_type: str,
        annotations: dict[str, str],
    ) -> Descriptor:
        """Push PAYLOAD as an artifact referring to SUBJECT; the artifact manifest's descriptor."""
        self.put_blob(repo, EMPTY, EMPTY_MEDIA_TYPE)
        layer = self.put_blob(repo, payload, payload_media_type)
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": sha256(EMPTY), "size": len(EMPTY)},
            "layers": [layer.as_json()],
            "subject": subject.as_json(),
            "annotations": annotations,
        }
        data = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
        desc = Descriptor(OCI_MANIFEST, sha256(data), len(data), artifact_type, tuple(sorted(annotations.items())))
        r = self.put_manifest(repo, desc.digest, data, OCI_MANIFEST)
        if not r.headers.get("OCI-Subject"):
            # the registry does not index referrers: keep the fallback tag's index (spec 1.1)
            self._add_to_fallback(repo, subject.digest, desc)
        return desc

    def _add_to_fallback(self, repo: str, subject_digest: str, desc: Descriptor) -> None:
        tag = fallback_tag(subject_digest)
        got = self.manifest(repo, tag)
        index: dict[str, Any] = (
            json.loads(got[0]) if got else {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        )
        if any(m.get("digest") == desc.digest for m in index["manifests"]):
            return
        index["manifests"].append(desc.as_json())
        self.put_manifest(repo, tag, json.dumps(index, separators=(",", ":")).encode(), OCI_INDEX)

    def referrers(self, repo: str, subject_digest: str, artifact_type: str = "") -> list[Descriptor]:
        """What is attached to SUBJECT_DIGEST in REPO: the referrers API where the registry
        serves it, else the fallback tag's index (empty when neither has anything)."""
        # a registry without the API answers 404 (distribution 2.x) or, for a route it does not
        # know, 400/405/501: each means "use the fallback tag"
        r = self._request(
            "GET",
            f"{repo}/referrers/{subject_digest}",
            f"list the referrers of {subject_digest}",
            (200, 400, 404, 405, 501),
            headers={"Accept": OCI_INDEX},
        )
        if r.status_code == 200 and r.headers.get("Content-Type", "").startswith(OCI_INDEX):
            found = r.json().get("manifests", [])
        else:
            got = self.manifest(repo, fallback_tag(subject_digest))
            found = json.loads(got[0]).get("manifests", []) if got else []
        out = [Descriptor.from_json(m) for m in found]
        return [d for d in out if not artifact_type or d.artifact_type == artifact_type]

    def copy_referrers(self, src_repo: str, dst_repo: str, subject: Descriptor, dst: Client | None = None) -> int:
        """Copy what is attached to SUBJECT in SRC_REPO into DST_REPO -- of this registry, or
        of DST (a mirror) -- where the same subject was already copied with its digest
        preserved; how many were copied (0 when all were there)."""
        dst = dst or self
        n = 0
        have = {d.digest for d in dst.referrers(dst_repo, subject.digest)}
        for d in self.referrers(src_repo, subject.digest):
            if d.digest in have:
                continue
            data, media_type = self.manifest(src_repo, d.digest) or (b"", "")
            doc = json.loads(data)
            for b in [doc["config"], *doc.get("layers", [])]:
                dst.put_blob(dst_repo, self.blob(src_repo, b["digest"]), b["mediaType"])
            r = dst.put_manifest(dst_repo, d.digest, data, media_type)
            if not r.headers.get("OCI-Subject"):
                dst._add_to_fallback(dst_repo, subject.digest, d)
            n += 1
        return n
