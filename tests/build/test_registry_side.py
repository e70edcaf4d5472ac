"""What delivery does registry side, with skopeo and `docker login`'s credentials, against the
real loopback registry (htpasswd, as GHCR/ACR/ECR): a zstd twin that keeps the image and changes
only the layer compression, and a retag by digest that writes the manifest unchanged. A small
image (the local Debian base) keeps this quick; tests/build/test_build.py promotes a real cell."""

import base64
import json
import os
import subprocess
import urllib.request

import pytest

from trainbase.deliver import referrers
from trainbase.deliver import registry as regmod

pytestmark = pytest.mark.engine

BASE = "trainbase-bootstrap/debian:12.15-slim"


def _manifest(reg, repo: str, tag: str) -> dict:
    auth = base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()
    req = urllib.request.Request(
        f"http://{reg.host}/v2/{repo}/manifests/{tag}",
        headers={
            "Authorization": f"Basic {auth}",
            "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, "
            "application/vnd.oci.image.index.v1+json",
        },
    )
    return json.load(urllib.request.urlopen(req, timeout=30))


def _blob(reg, repo: str, digest: str) -> dict:
    auth = base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()
    req = urllib.request.Request(
        f"http://{reg.host}/v2/{repo}/blobs/{digest}", headers={"Authorization": f"Basic {auth}"}
    )
    return json.load(urllib.request.urlopen(req, timeout=30))


def _push(docker, reg, image: str, ref: str) -> None:
    """`docker tag IMAGE REF` and `docker push REF` with the fixture's login; each must succeed."""
    for args in (["tag", image, ref], ["push", ref]):
        r = subprocess.run(
            [docker, "--config", str(reg.config), *args], capture_output=True, text=True, timeout=600, check=False
        )
        assert r.returncode == 0, r.stderr


def test_zstd_twin_and_retag_by_digest(registry, docker, monkeypatch):
    if subprocess.run([docker, "image", "inspect", BASE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"{BASE} is not in the engine (the build bootstraps it)")
    repo, tag = "trainbase/registry-side", "r" + "5" * 12
    src = f"{registry.host}/{repo}:{tag}"
    _push(docker, registry, BASE, src)
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    gzip_digest = registry.digest(repo, tag)
    regmod.zstd_twin(src, f"{src}-zstd")
    twin = _manifest(registry, repo, f"{tag}-zstd")
    assert twin["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert {layer["mediaType"] for layer in twin["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    gz = _manifest(registry, repo, tag)
    assert all("gzip" in layer["mediaType"] for layer in gz["layers"]) and len(gz["layers"]) == len(twin["layers"])
    # the same filesystem: the uncompressed layer digests (diff_ids) of both configs agree
    diff_ids = [_blob(registry, repo, m["config"]["digest"])["rootfs"]["diff_ids"] for m in (gz, twin)]
    assert diff_ids[0] == diff_ids[1], "the twin is not the same image"
    assert registry.digest(repo, tag) == gzip_digest, "the gzip tag is untouched"
    # retag by digest, registry side: the alias gets exactly that manifest
    regmod.retag(f"{registry.host}/{repo}@{gzip_digest}", f"{registry.host}/{repo}:latest")
    assert registry.digest(repo, "latest") == gzip_digest
    # without credentials the registry refuses, and the error says how to log in
    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    with pytest.raises(regmod.RegistryAuthError, match=f"docker login {registry.host}"):
        regmod.retag(f"{registry.host}/{repo}@{gzip_digest}", f"{registry.host}/{repo}:other")


def _platform_image(docker, tmp_path, arch: str) -> str:
    """A tiny image OF ``arch`` (its config says so), made without running anything of it:
    BuildKit's --platform with FROM scratch + COPY."""
    ctx = tmp_path / arch
    ctx.mkdir()
    (ctx / "which").write_text(f"{arch}\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY which /which\n")
    ref = f"trainbase-test/index-{arch}:t"
    r = subprocess.run(
        [docker, "build", "--platform", f"linux/{arch}", "-t", ref, str(ctx)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "DOCKER_BUILDKIT": "1"},
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return ref


def test_a_multi_arch_index_is_one_tag_and_each_platform_pulls_its_own(registry, docker, monkeypatch, tmp_path):
    """publish's index push: two platform images become ONE tag holding an OCI image index (no
    per-platform tag in the repository), and a pull for either platform gets that platform's
    image -- read back through the registry API, skopeo's platform override and docker pull."""
    images = {f"linux/{a}": _platform_image(docker, tmp_path, a) for a in ("amd64", "arm64")}
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    repo, tag = "trainbase/index-test", "r" + "6" * 12
    digest = regmod.push_index(registry.host, f"{registry.host}/{repo}:{tag}", images)
    assert registry.digest(repo, tag) == digest
    assert registry.tags(repo) == [tag], "a per-platform tag was pushed"
    assert set(regmod.platforms_of(registry.host, f"{registry.host}/{repo}:{tag}")) == set(images)
    for arch in ("amd64", "arm64"):
        r = subprocess.run(
            [
                "skopeo",
                "inspect",
                "--tls-verify=false",
                "--authfile",
                str(registry.config / "config.json"),
                "--override-arch",
                arch,
                f"docker://{registry.host}/{repo}:{tag}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert r.returncode == 0 and json.loads(r.stdout)["Architecture"] == arch, r.stderr
    ref = f"{registry.host}/{repo}:{tag}"
    # CI's way: each platform's runner staged its image (docker push to <ns>/staging/<cell>),
    # --merge-platforms makes the index registry side over the staged manifests, byte for byte:
    # the digests the builds attested are the ones the index serves
    from trainbase.deliver import platforms

    staged, staged_digests = {}, {}
    for plat, image in images.items():
        stage_repo = f"trainbase/staging/index-test-{plat.split('/')[1]}"
        _push(docker, registry, image, f"{registry.host}/{stage_repo}:t")
        staged[plat] = f"docker://{registry.host}/{stage_repo}:t"
        staged_digests[plat] = registry.digest(stage_repo, "t")
    merged = platforms._index_of_staged(
        registry.host,
        repo,
        "merged",
        {p: (s.removeprefix(f"docker://{registry.host}/").rsplit(":", 1)[0], "t") for p, s in staged.items()},
    )
    assert registry.digest(repo, "merged") == merged
    assert regmod.platforms_of(registry.host, f"{registry.host}/{repo}:merged") == staged_digests, (
        "the index does not serve the staged (attested) digests"
    )
    # its zstd twin: one index again, every platform's layers zstd, the same filesystems
    import io

    from trainbase.deliver import publish

    publish.index_twin(registry.host, repo, "merged", io.StringIO(), repo)
    twin = _manifest(registry, repo, "merged-zstd")
    assert twin["mediaType"] == regmod.INDEX_MEDIA_TYPE and len(twin["manifests"]) == 2
    gz = _manifest(registry, repo, "merged")
    for plat_z, plat_g in zip(
        sorted(twin["manifests"], key=lambda m: m["platform"]["architecture"]),
        sorted(gz["manifests"], key=lambda m: m["platform"]["architecture"]),
        strict=True,
    ):
        mz, mg = (_manifest(registry, repo, m["digest"]) for m in (plat_z, plat_g))
        assert {layer["mediaType"] for layer in mz["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
        assert [_blob(registry, repo, m["config"]["digest"])["rootfs"]["diff_ids"] for m in (mz, mg)][0] == _blob(
            registry, repo, mg["config"]["digest"]
        )["rootfs"]["diff_ids"]
        images.update({f"staged-{p}": s.removeprefix("docker://") for p, s in staged.items()})
    try:
        r = subprocess.run(
            [docker, "--config", str(registry.config), "pull", "--platform", "linux/arm64", ref],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        arch = subprocess.run(
            [docker, "image", "inspect", "-f", "{{.Architecture}}", ref], capture_output=True, text=True, check=False
        ).stdout.strip()
        assert arch == "arm64"
    finally:
        for im in [ref, *images.values()]:
            subprocess.run([docker, "rmi", "-f", im], capture_output=True, check=False)


def _keypair(tmp_path, name: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub"
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


def test_signed_sbom_and_provenance_are_attached_listed_and_verified(registry, docker, monkeypatch, tmp_path):
    """Attach (as `--push --sign-key` does), list (the registry has no referrers API: the
    fallback tag), verify with the public key; a wrong key, a tampered envelope and an image
    without attestations fail; promotion by digest keeps them."""
    import io
    from types import SimpleNamespace

    from trainbase.deliver import attest, referrers
    from trainbase.supply import attestation as att

    image = _platform_image(docker, tmp_path, "amd64")
    repo, tag = "trainbase/attested", "r" + "a" * 12
    ref = f"{registry.host}/{repo}:{tag}"
    _push(docker, registry, image, ref)
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    job = SimpleNamespace(name="attested", tag=tag, platform="linux/amd64", image=image)
    docs = tmp_path / "supply" / job.name / tag
    docs.mkdir(parents=True)
    sbom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"name": "openmpi", "version": "4.1.4"}]}
    (docs / "sbom.cdx.json").write_text(json.dumps(sbom))
    (docs / "inputs.lock.json").write_text(
        json.dumps(
            {
                "tag": tag,
                "recipe": "ab" * 32,
                "inputs": {
                    "base": {"how": "bootstrap", "identity": "packages-sha256:" + "c" * 64, "ref": BASE},
                    "artifacts": {"openmpi": {"url": "http://deb.debian.org/x.tar.xz", "sha256": "d" * 64}},
                },
            }
        )
    )
    key, pub = _keypair(tmp_path, "signing")
    out = io.StringIO()
    signer = attest.Attester(f"{registry.host}/trainbase", tmp_path / "supply", key, out)
    signer.attach(job, repo, tag)
    signer.attach(job, repo, tag)  # a re-run attaches nothing twice
    assert out.getvalue().count("signed (key") == 2 and out.getvalue().count("already attached") == 2, out.getvalue()

    client = referrers.Client(registry.host)
    digest = registry.digest(repo, tag)
    found = client.referrers(repo, digest)
    assert sorted(dict(d.annotations)[att.PREDICATE_ANNOTATION] for d in found) == sorted(att.PREDICATES)
    fallback = client.manifest(repo, referrers.fallback_tag(digest))
    assert fallback and len(json.loads(fallback[0])["manifests"]) == 2, "the fallback tag lists them"
    envelope = client.blob(repo, json.loads(client.manifest(repo, found[0].digest)[0])["layers"][0]["digest"])
    stmt = att.verify(envelope, att.load_public_key(pub), digest, dict(found[0].annotations)[att.PREDICATE_ANNOTATION])
    assert stmt["subject"][0]["digest"] == {"sha256": digest.split(":")[1]}

    out = io.StringIO()
    assert attest.verify_command(None, tmp_path, [], ref, None, str(pub), out=out) == 0, out.getvalue()
    assert out.getvalue().count("subject matches") == 2
    prov = next(
        att.verify(
            client.blob(repo, json.loads(client.manifest(repo, d.digest)[0])["layers"][0]["digest"]),
            att.load_public_key(pub),
            digest,
            att.PROVENANCE,
        )
        for d in found
        if dict(d.annotations)[att.PREDICATE_ANNOTATION] == att.PROVENANCE
    )
    deps = {d["name"]: d for d in prov["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps["artifact:openmpi"]["digest"] == {"sha256": "d" * 64}
    assert deps["base"]["digest"] == {"packages-sha256": "c" * 64}

    # the scheduled security check reads the SBOM of what users pull from the registry
    assert attest.sbom_of(client, repo, tag, "linux/amd64") == sbom

    # promotion retags by digest: latest has the same attestations
    regmod.retag(f"{registry.host}/{repo}@{digest}", f"{registry.host}/{repo}:latest")
    assert (
        attest.verify_command(None, tmp_path, [], f"{registry.host}/{repo}:latest", None, str(pub), out=io.StringIO())
        == 0
    )

    # --merge-platforms copies a staged image's attestations into the published repository
    merged = "trainbase/attested-merged"
    regmod.retag(f"{registry.host}/{repo}@{digest}", f"{registry.host}/{merged}:{tag}")
    assert client.copy_referrers(repo, merged, client.descriptor(repo, tag)) == 2
    assert client.copy_referrers(repo, merged, client.descriptor(repo, tag)) == 0
    assert (
        attest.verify_command(None, tmp_path, [], f"{registry.host}/{merged}:{tag}", None, str(pub), out=io.StringIO())
        == 0
    )

    _, other = _keypair(tmp_path, "other")
    out = io.StringIO()
    assert attest.verify_command(None, tmp_path, [], ref, None, str(other), out=out) == 1
    assert "NOT verified" in out.getvalue() and "signature does not verify" in out.getvalue(), out.getvalue()

    # a tampered attestation: the signed payload swapped for one about another image
    tampered_repo = "trainbase/tampered"
    tref = f"{registry.host}/{tampered_repo}:{tag}"
    _push(docker, registry, image, tref)
    out = io.StringIO()
    assert attest.verify_command(None, tmp_path, [], tref, None, str(pub), out=out) == 1
    assert out.getvalue().count("nothing attached") == 2, out.getvalue()
    forged = json.loads(envelope)
    forged["payload"] = base64.b64encode(
        json.dumps(att.statement("x", digest, att.SBOM, {"forged": True})).replace(" ", "").encode()
    ).decode()
    subject = client.descriptor(tampered_repo, tag)
    for ptype in att.PREDICATES:
        client.attach(
            tampered_repo,
            subject,
            att.DSSE_MEDIA_TYPE,
            json.dumps(forged).encode(),
            att.DSSE_MEDIA_TYPE,
            {att.PREDICATE_ANNOTATION: ptype},
        )
    out = io.StringIO()
    assert attest.verify_command(None, tmp_path, [], tref, None, str(pub), out=out) == 1
    assert out.getvalue().count("signature does not verify") == 2, out.getvalue()

    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    with pytest.raises(regmod.RegistryAuthError, match=f"docker login {registry.host}"):
        referrers.Client(registry.host).referrers(repo, digest)


def test_a_mirror_gets_the_promoted_digest_its_tag_latest_and_attestations(registry, docker, monkeypatch, tmp_path):
    """The primary (namespace `primary`) promoted a cell; the mirror (namespace `mirror` -- the
    same code path as another host) gets the immutable tag, latest by digest and the signed
    attestations; a second run changes nothing; an unpromoted cell is left alone."""
    import io
    from types import SimpleNamespace

    from trainbase.deliver import attest, mirror

    image = _platform_image(docker, tmp_path, "amd64")
    tag = "r" + "b" * 12
    src = f"{registry.host}/primary/cellx"
    _push(docker, registry, image, f"{src}:{tag}")
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    out = io.StringIO()
    assert (
        mirror.mirror_one(f"{registry.host}/primary", f"{registry.host}/mirror", "cellx", tag, out)
        == "not promoted in the primary: nothing to mirror"
    )
    digest = registry.digest("primary/cellx", tag)
    regmod.retag(f"{src}@{digest}", f"{src}:latest")
    docs = tmp_path / "supply" / "cellx" / tag
    docs.mkdir(parents=True)
    (docs / "sbom.cdx.json").write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6"}))
    (docs / "inputs.lock.json").write_text(json.dumps({"tag": tag, "inputs": {}}))
    key, pub = _keypair(tmp_path, "k")
    attest.Attester(f"{registry.host}/primary", tmp_path / "supply", key, io.StringIO()).attach(
        SimpleNamespace(name="cellx", tag=tag, platform="linux/amd64", image=image), "primary/cellx", tag
    )

    done = mirror.mirror_one(f"{registry.host}/primary", f"{registry.host}/mirror", "cellx", tag, out)
    assert done == f"{tag} copied, latest -> {digest}, 2 attestation(s)"
    assert registry.digest("mirror/cellx", tag) == digest and registry.digest("mirror/cellx", "latest") == digest
    assert (
        attest.verify_command(
            None, tmp_path, [], f"{registry.host}/mirror/cellx:latest", None, str(pub), out=io.StringIO()
        )
        == 0
    )
    assert (
        mirror.mirror_one(f"{registry.host}/primary", f"{registry.host}/mirror", "cellx", tag, out) == "already current"
    )


def test_a_tag_its_first_run_left_unattested_and_its_zstd_twin_are_attested_by_the_next(
    registry, docker, monkeypatch, tmp_path
):
    """`--push --zstd-twin --sign-key`: a run pushed the tag and its twin, then failed before
    attesting (here: no signer). The next run finds both published -- immutable, left as is --
    records them with the tag's digest, and attaches what each lacks; the twin (what
    latest-zstd points to) is its own digest and verifies on its own."""
    import io
    from dataclasses import dataclass, field

    from trainbase.deliver import attest, publish
    from trainbase_common.states import JobState

    local_image = _platform_image(docker, tmp_path, "amd64")
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    recipe_tag = tag = "r" + "b" * 12

    @dataclass
    class Job:
        name: str = "late-attested"
        repository: str = "late-attested"
        platform: str = "linux/amd64"
        image: str = local_image
        tag: str = recipe_tag
        parent: str | None = None
        status: JobState = JobState.BUILT
        pushed: list = field(default_factory=list)
        present: list = field(default_factory=list)
        repo_digest: str | None = None

    docs = tmp_path / "supply" / "late-attested" / tag
    docs.mkdir(parents=True)
    (docs / "sbom.cdx.json").write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "components": []}))
    (docs / "inputs.lock.json").write_text(
        json.dumps(
            {
                "tag": tag,
                "recipe": "ab" * 32,
                "inputs": {
                    "base": {"how": "bootstrap", "identity": "packages-sha256:" + "c" * 64, "ref": BASE},
                    "artifacts": {},
                },
            }
        )
    )
    key, pub = _keypair(tmp_path, "late")

    def tag_local(src, dst):
        subprocess.run([docker, "tag", src, dst], check=True, capture_output=True)

    ns = f"{registry.host}/trainbase"
    ref = f"{ns}/late-attested:{tag}"
    first = Job()
    publish.publish([first], ns, tag_local, io.StringIO(), zstd_twin=True)
    assert first.pushed == [ref, ref + "-zstd"]
    for r in (ref, ref + "-zstd"):
        out = io.StringIO()
        assert attest.verify_command(None, tmp_path, [], r, None, str(pub), out=out) == 1, out.getvalue()

    again = Job()
    out = io.StringIO()
    signer = attest.Attester(ns, tmp_path / "supply", key, out)
    publish.publish([again], ns, tag_local, out, zstd_twin=True, attest=signer.attach)
    assert again.pushed == [] and again.present == [ref, ref + "-zstd"], out.getvalue()
    assert again.repo_digest == registry.digest("trainbase/late-attested", tag)
    assert out.getvalue().count("signed (key") == 4, out.getvalue()
    for r in (ref, ref + "-zstd"):
        check = io.StringIO()
        assert attest.verify_command(None, tmp_path, [], r, None, str(pub), out=check) == 0, check.getvalue()


def test_a_blob_is_mounted_across_repositories_or_streamed_where_the_registry_declines(registry, monkeypatch):
    """--merge-platforms copies each staged platform's blobs into the published repository
    (referrers.Client.copy_blob): mounted, no byte moving, where the registry mounts; streamed in
    chunks where it declines and opens an upload instead (a registry may; a layer is gigabytes)."""
    monkeypatch.setenv("DOCKER_CONFIG", str(registry.config))
    client = referrers.Client(registry.host)
    payload = os.urandom(20 << 20)  # more than two 8 MiB chunks
    desc = client.put_blob("trainbase/blob-src", payload, "application/octet-stream")
    real, calls = client._request, []

    def spy(method, path, *a, **kw):
        calls.append((method, path.split("?")[0].rsplit("/", 2)[-2]))
        return real(method, path, *a, **kw)

    monkeypatch.setattr(client, "_request", spy)
    client.copy_blob("trainbase/blob-src", "trainbase/blob-mounted", desc.digest)
    assert ("GET", "blobs") not in calls, f"a mountable blob was downloaded: {calls}"
    assert client.blob("trainbase/blob-mounted", desc.digest) == payload

    def declines(method, path, *a, **kw):  # what a registry without cross-repository mounts answers
        return spy(method, path.split("?mount=")[0], *a, **kw)

    calls.clear()
    monkeypatch.setattr(client, "_request", declines)
    client.copy_blob("trainbase/blob-src", "trainbase/blob-streamed", desc.digest)
    assert ("GET", "blobs") in calls, calls
    assert client.blob("trainbase/blob-streamed", desc.digest) == payload
    calls.clear()
    client.copy_blob("trainbase/blob-src", "trainbase/blob-streamed", desc.digest)
    assert [m for m, _ in calls] == ["HEAD"], f"a blob already there was copied again: {calls}"
