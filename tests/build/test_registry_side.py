"""What delivery does registry side, with skopeo and `docker login`'s credentials, against the
real loopback registry (htpasswd, as GHCR/ACR/ECR): a zstd twin that keeps the image and changes
only the layer compression, and a retag by digest that writes the manifest unchanged. A small
image (the local Debian base) keeps this quick; tests/build/test_build.py promotes a real cell."""
import base64
import json
import subprocess
import urllib.request

import pytest

from trainbase.deliver import registry as regmod

pytestmark = pytest.mark.engine

BASE = "trainbase-bootstrap/debian:12.15-slim"


def _manifest(reg, repo: str, tag: str) -> dict:
    auth = base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()
    req = urllib.request.Request(f"http://{reg.host}/v2/{repo}/manifests/{tag}", headers={
        "Authorization": f"Basic {auth}",
        "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
    return json.load(urllib.request.urlopen(req, timeout=30))


def _blob(reg, repo: str, digest: str) -> dict:
    auth = base64.b64encode(f"{reg.user}:{reg.password}".encode()).decode()
    req = urllib.request.Request(f"http://{reg.host}/v2/{repo}/blobs/{digest}", headers={"Authorization": f"Basic {auth}"})
    return json.load(urllib.request.urlopen(req, timeout=30))


def test_zstd_twin_and_retag_by_digest(registry, docker, monkeypatch):
    if subprocess.run([docker, "image", "inspect", BASE], capture_output=True).returncode != 0:
        pytest.skip(f"{BASE} is not in the engine (the build bootstraps it)")
    repo, tag = "trainbase/registry-side", "r" + "5" * 12
    src = f"{registry.host}/{repo}:{tag}"
    for args in (["tag", BASE, src], ["push", src]):
        r = subprocess.run([docker, "--config", str(registry.config), *args], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
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
    r = subprocess.run([docker, "build", "--platform", f"linux/{arch}", "-t", ref, str(ctx)], capture_output=True,
                       text=True, timeout=600, env={**__import__("os").environ, "DOCKER_BUILDKIT": "1"})
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
        r = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--authfile", str(registry.config / "config.json"),
                            "--override-arch", arch, f"docker://{registry.host}/{repo}:{tag}"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and json.loads(r.stdout)["Architecture"] == arch, r.stderr
    ref = f"{registry.host}/{repo}:{tag}"
    # CI's way: each platform's runner staged its image (docker push to <ns>/staging/<cell>),
    # one job merges them registry to registry into an index of the same platforms
    staged = {}
    for plat, image in images.items():
        stage = f"{registry.host}/trainbase/staging/index-test-{plat.split('/')[1]}:t"
        for args in (["tag", image, stage], ["push", stage]):
            r = subprocess.run([docker, "--config", str(registry.config), *args], capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 0, r.stderr
        staged[plat] = f"docker://{stage}"
    merged = regmod.push_index(registry.host, f"{registry.host}/{repo}:merged", staged)
    assert registry.digest(repo, "merged") == merged
    assert set(regmod.platforms_of(registry.host, f"{registry.host}/{repo}:merged")) == set(images)
    images.update({f"staged-{p}": s.removeprefix("docker://") for p, s in staged.items()})
    try:
        r = subprocess.run([docker, "--config", str(registry.config), "pull", "--platform", "linux/arm64", ref],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        arch = subprocess.run([docker, "image", "inspect", "-f", "{{.Architecture}}", ref], capture_output=True,
                              text=True).stdout.strip()
        assert arch == "arm64"
    finally:
        for im in [ref, *images.values()]:
            subprocess.run([docker, "rmi", "-f", im], capture_output=True)
