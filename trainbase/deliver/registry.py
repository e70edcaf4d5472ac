"""Registry access WITH the user's credentials: existence checks, pushes and pulls go through
the engine (trainbase_common.engine, the docker SDK), which authenticates with what `docker login` stored (the CLI's
config.json or its credential helper; DOCKER_CONFIG is honoured). GHCR, ACR and ECR answer
every anonymous request with 401: a check that read that as "unknown" pushed nothing and
pulled no parent in CI. Here 401/403 are errors that say how to log in; a registry that cannot
be reached is an error too. Nothing is ever guessed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from trainbase_common import engine

from ..errors import TrainbaseError

# How a refusal is worded where no status is said: distribution's error codes (UNAUTHORIZED,
# DENIED) and the engine's own token client. Never bare digits: a 500 whose body holds "403"
# (a request id, a digest) was once told to "log in first" (issue 64).
_AUTH = re.compile(
    r"(?i)(unauthorized|authentication required|no basic auth credentials|\bdenied\b|forbidden|"
    r"incorrect username or password)"
)


def refused(message: str, status: int | None = None) -> bool:
    """Whether the registry refused the credentials: by its status (401/403) where the answer
    carries one -- the engine's own, else the one the message quotes -- and only where neither
    does, by distribution's words."""
    if status in (401, 403):
        return True
    said = engine.registry_status(message)
    if said is not None:
        return said in (401, 403)
    return bool(_AUTH.search(message))


_ABSENT = re.compile(r"(?i)(manifest unknown|not found|no such manifest|name unknown)")


class RegistryError(TrainbaseError):
    """The registry could not answer (unreachable, or a server error)."""

    code = 1


class RegistryAuthError(RegistryError):
    """The registry refused these credentials (or their absence)."""


def split_registry(registry: str) -> tuple[str, str]:
    """`HOST[:PORT]/NAMESPACE` -> (host, namespace)."""
    host, sep, ns = registry.partition("/")
    if not sep or not host or not ns or not re.fullmatch(r"[a-z0-9]+([._/-][a-z0-9]+)*", ns):
        raise TrainbaseError(f"--registry {registry!r}: expected HOST[:PORT]/NAMESPACE (e.g. 127.0.0.1:5000/trainbase)")
    return host, ns


def login_hint(host: str) -> str:
    if host == "ghcr.io":
        return "`echo $GITHUB_TOKEN | docker login ghcr.io -u USER --password-stdin` (a token with write:packages)"
    if host.endswith(".azurecr.io"):
        return f"`az acr login --name {host.split('.')[0]}`"
    if ".ecr." in host and host.endswith(".amazonaws.com"):
        return f"`aws ecr get-login-password | docker login --username AWS --password-stdin {host}`"
    return f"`docker login {host}`"


def _classify(host: str, what: str, message: str, status: int | None = None) -> RegistryError:
    is_refusal = refused(str(message), status)  # anywhere in it: skopeo puts the cause last
    message = " ".join(str(message).split())
    message = message[-300:] if len(message) > 300 else message
    if is_refusal:
        return RegistryAuthError(
            f"registry {host} refused to {what} ({message}): log in first with "
            f"{login_hint(host)}; trainbase uses the credentials `docker login` stored"
        )
    return RegistryError(f"registry {host} could not {what}: {message}")


def digest(host: str, repo: str, tag: str) -> str | None:
    """The registry's digest of HOST/REPO:TAG (asked through the engine with the stored
    credentials), None when the tag does not exist. Raises RegistryAuthError on 401/403 and
    RegistryError when the registry cannot say: never a third answer."""
    ref = f"{host}/{repo}:{tag}"
    try:
        return engine.distribution_digest(ref)
    except engine.EngineAPIError as e:
        if (e.status == 404 or _ABSENT.search(str(e))) and not refused(str(e), e.status):
            return None
        raise _classify(host, f"say whether {ref} exists", str(e), e.status) from None
    except engine.EngineError as e:
        raise RegistryError(f"no engine to ask registry {host} about {ref}: {e}") from None


def tag_state(host: str, repo: str, tag: str) -> Literal["present", "absent"]:
    """Whether HOST/REPO:TAG exists (see digest)."""
    return "present" if digest(host, repo, tag) is not None else "absent"


def push(host: str, ref: str) -> str:
    """Push ``ref`` (already tagged locally); its digest. Raises RegistryError/RegistryAuthError."""
    try:
        return engine.push(ref)
    except engine.EngineError as e:
        raise _classify(host, f"accept {ref}", str(e), getattr(e, "status", None)) from None


def pull(host: str, ref: str) -> None:
    """Pull ``ref`` with the stored credentials. Raises RegistryError/RegistryAuthError."""
    try:
        engine.pull(ref)
    except engine.EngineError as e:
        raise _classify(host, f"serve {ref}", str(e), getattr(e, "status", None)) from None


def _skopeo_copy(
    host: str,
    src: str,
    dst: str,
    what: str,
    *options: str,
    source: str = "",
    dest: str = "",
    src_config: Path | None = None,
    dst_config: Path | None = None,
) -> None:
    """`skopeo copy` between two references of HOST (or a local ``source``/``dest`` transport
    such as ``oci:DIR:TAG``) with `docker login`'s credentials: DOCKER_CONFIG's, or each side's
    own DOCKER_CONFIG directory where given (two logins to one host cannot share a config.json)."""
    if shutil.which("skopeo") is None:
        raise RegistryError(
            f"to {what}, trainbase runs skopeo, which is not installed "
            "(apt-get install skopeo; GitHub's ubuntu runners have it)"
        )
    cmd = ["skopeo", "copy", "--retry-times", "2", "--quiet", *options]
    authfile = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    for flag, config in (("--src-authfile", src_config), ("--dest-authfile", dst_config)):
        if config is not None and (config / "config.json").exists():
            cmd += [flag, str(config / "config.json")]
    if authfile.exists() and src_config is None and dst_config is None:
        cmd += ["--authfile", str(authfile)]
    elif authfile.exists():
        # the side without its own directory keeps DOCKER_CONFIG's logins
        cmd += [
            f
            for flag, config in (("--src-authfile", src_config), ("--dest-authfile", dst_config))
            if config is None
            for f in (flag, str(authfile))
        ]
    if _loopback(host):
        cmd += ["--src-tls-verify=false", "--dest-tls-verify=false"]
    p = subprocess.run(
        [*cmd, source or f"docker://{src}", dest or f"docker://{dst}"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if p.returncode != 0:
        raise _classify(host, what, (p.stderr or p.stdout).strip())


def _loopback(host: str) -> bool:
    """A registry on this machine: the engine talks plain HTTP to it (127.0.0.0/8 is insecure
    by default), so skopeo must too."""
    name = host.rsplit(":", 1)[0]
    return name == "localhost" or name.startswith("127.")


def retag(src: str, dst: str, src_config: Path | None = None, dst_config: Path | None = None) -> None:
    """Point DST (HOST/REPO:TAG) at the manifest SRC names (HOST/REPO@sha256:...), registry side:
    `skopeo copy --all --preserve-digests`, whose blobs are already there, so only the manifest
    (or the multi-arch index) is written and its digest cannot change. Credentials: what
    `docker login` stored (DOCKER_CONFIG honoured; credential helpers included)."""
    _skopeo_copy(
        dst.partition("/")[0],
        src,
        dst,
        f"retag {dst} to {src}",
        "--all",
        "--preserve-digests",
        src_config=src_config,
        dst_config=dst_config,
    )


def zstd_twin(src: str, dst: str) -> None:
    """Write DST, the image SRC names with its layers recompressed as zstd (OCI media types):
    for engines that read zstd (Docker >= 23, containerd, Podman 4, enroot 4) a faster pull;
    SRC (gzip) stays what every engine reads (docs/tags.md). Through a local OCI layout: copied
    registry to registry, skopeo would reuse the gzip blobs the repository already has and
    write a twin that is not zstd at all (skopeo 1.9). ``--all``: SRC may be a multi-arch index;
    every platform is recompressed and the twin is an index of the recompressed manifests
    (measured with skopeo 1.9.3: both platforms' layers tar+zstd)."""
    import tempfile

    host = dst.partition("/")[0]
    with tempfile.TemporaryDirectory(prefix="trainbase-zstd-") as d:
        _skopeo_copy(
            host,
            src,
            "",
            f"recompress {src} as zstd",
            "--all",
            "--format",
            "oci",
            "--dest-compress-format",
            "zstd",
            dest=f"oci:{d}:twin",
        )
        _skopeo_copy(host, "", dst, f"push the zstd twin {dst}", "--all", "--preserve-digests", source=f"oci:{d}:twin")


INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


def push_index(host: str, target: str, images: dict[str, str]) -> str:
    """Push one multi-arch image index under ``target`` (HOST/REPO:TAG) holding ``images``
    (OCI platform -> a local engine image: a run that built every platform; CI's staged
    images are merged registry side instead, platforms._index_of_staged), and return its digest. Every platform's image is
    copied into one local OCI layout, the index is written there over their manifests, and
    the layout is pushed once with ``--all --preserve-digests``: the registry receives the
    platforms' manifests untagged and one tag, the index -- never a per-platform tag, never a
    moment where TAG names one platform only. A pull on either architecture resolves its own."""
    import hashlib
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trainbase-index-", dir=os.environ.get("TMPDIR") or "/var/tmp") as d:  # noqa: S108 -- tempfile picks the private name
        manifests = []
        for plat, image in sorted(images.items()):
            ref = "p-" + plat.replace("/", "-")
            source = f"docker-daemon:{image}"
            # skopeo's docker-daemon transport asks the default socket, whatever DOCKER_HOST says
            daemon = ["--src-daemon-host", os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []
            _skopeo_copy(
                host,
                "",
                "",
                f"copy {image} ({plat}) into an OCI layout",
                "--format",
                "oci",
                *daemon,
                source=source,
                dest=f"oci:{d}:{ref}",
            )
            layout = json.loads(Path(d, "index.json").read_text())
            desc = next(
                m
                for m in layout["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref
            )
            os_, arch = plat.split("/", 1)
            manifests.append(
                {
                    "mediaType": desc["mediaType"],
                    "digest": desc["digest"],
                    "size": desc["size"],
                    "platform": {"architecture": arch, "os": os_},
                }
            )
        index = json.dumps(
            {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": manifests}, separators=(",", ":")
        ).encode()
        digest = "sha256:" + hashlib.sha256(index).hexdigest()
        Path(d, "blobs", "sha256", digest.split(":", 1)[1]).write_bytes(index)
        layout = json.loads(Path(d, "index.json").read_text())
        layout["manifests"].append(
            {
                "mediaType": INDEX_MEDIA_TYPE,
                "digest": digest,
                "size": len(index),
                "annotations": {"org.opencontainers.image.ref.name": "index"},
            }
        )
        Path(d, "index.json").write_text(json.dumps(layout))
        _skopeo_copy(
            host, "", target, f"push the image index {target}", "--all", "--preserve-digests", source=f"oci:{d}:index"
        )
    return digest


def platforms_of(host: str, ref: str) -> dict[str, str]:
    """OCI platform -> manifest digest of the index ``ref`` names ({} for a single-platform
    image), read from the registry (skopeo inspect --raw)."""
    import json

    cmd = ["skopeo", "inspect", "--raw"] + (["--tls-verify=false"] if _loopback(host) else []) + [f"docker://{ref}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if p.returncode != 0:
        raise _classify(host, f"describe {ref}", (p.stderr or p.stdout).strip())
    doc = json.loads(p.stdout)
    return {
        f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
        for m in doc.get("manifests", [])
        if m.get("platform")
    }
