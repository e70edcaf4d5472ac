"""Attestations of pushed images (trainbase/supply/attestation.py, trainbase/deliver/attest.py):
statements, provenance read from an input lock, DSSE signing and every way verification must
refuse; the CI wiring that signs keyless. The registry side runs for real in
tests/build/test_registry_side.py."""

import base64
import json
from types import SimpleNamespace

import pytest
import yaml

from trainbase.cli.main import main
from trainbase.deliver import attest
from trainbase.supply import attestation as att

from .conftest import ROOT

DIGEST = "sha256:" + "1" * 64
LOCK = {
    "tag": "r" + "a" * 12,
    "recipe": "b" * 64,
    "inputs": {
        "base": {
            "how": "registry",
            "identity": "sha256:" + "c" * 64,
            "ref": "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04",
        },
        "artifacts": {"ucx": {"url": "https://example.org/ucx-1.19.0.tar.gz", "sha256": "d" * 64}},
        "sources": {"gdrcopy-2.6": {"repository": "NVIDIA/gdrcopy", "commit": "9" * 40, "tree": "8" * 40}},
        "pip_locks": {"locks/python-py3.11.txt": "e" * 64},
        "patches": {},
        "parent_tag": "trainbase/base:r" + "f" * 12,
    },
}
LABELS = {
    "org.opencontainers.image.source": "https://github.com/example/trainbase",
    "org.opencontainers.image.revision": "0123abcd" * 5,
    "org.opencontainers.image.created": "2026-11-26T03:00:00Z",
}


@pytest.fixture
def keys(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = []
    for name in ("signing", "other"):
        k = ec.generate_private_key(ec.SECP256R1())
        (tmp_path / f"{name}.pem").write_bytes(
            k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )
        (tmp_path / f"{name}.pub").write_bytes(
            k.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        out.append((att.load_signer(tmp_path / f"{name}.pem"), att.load_public_key(tmp_path / f"{name}.pub")))
    return out


def test_provenance_names_every_input_by_digest_and_the_workflow_run_that_built_it(monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKFLOW_REF", "example/trainbase/.github/workflows/build.yml@refs/heads/main")
    monkeypatch.setenv("GITHUB_REPOSITORY", "example/trainbase")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    p = att.provenance("openmpi4.1.4-cuda12.8-cudnn9-ubuntu22.04", "linux/amd64", LOCK, LABELS)
    deps = {d["name"]: d for d in p["buildDefinition"]["resolvedDependencies"]}
    assert deps["base"]["digest"] == {"sha256": "c" * 64} and deps["base"]["uri"].startswith("docker://nvidia/cuda:")
    assert deps["artifact:ucx"] == {
        "name": "artifact:ucx",
        "uri": "https://example.org/ucx-1.19.0.tar.gz",
        "digest": {"sha256": "d" * 64},
    }
    # a source tree is pinned by its commit and its tree id, not by an archive's bytes
    assert deps["source:gdrcopy-2.6"] == {
        "name": "source:gdrcopy-2.6",
        "uri": "git+https://github.com/NVIDIA/gdrcopy@" + "9" * 40,
        "digest": {"gitCommit": "9" * 40, "gitTree": "8" * 40},
    }
    assert (
        deps["pip_locks:locks/python-py3.11.txt"]["uri"]
        == f"git+https://github.com/example/trainbase@{LABELS['org.opencontainers.image.revision']}#locks/python-py3.11.txt"
    )
    assert deps["parent"]["uri"] == "docker://trainbase/base:r" + "f" * 12
    assert deps["source"]["digest"] == {"gitCommit": LABELS["org.opencontainers.image.revision"]}
    assert p["buildDefinition"]["externalParameters"]["recipe"] == "b" * 64
    assert (
        p["runDetails"]["builder"]["id"]
        == "https://github.com/example/trainbase/.github/workflows/build.yml@refs/heads/main"
    )
    assert p["runDetails"]["metadata"] == {
        "invocationId": "https://github.com/example/trainbase/actions/runs/42/attempts/1",
        "finishedOn": "2026-11-26T03:00:00Z",
    }


def test_a_signed_statement_verifies_only_with_its_key_for_its_digest_and_predicate(keys):
    (signer, key), (_, other) = keys
    env = att.sign(att.statement("registry.example/trainbase/x", DIGEST, att.SBOM, {"bomFormat": "CycloneDX"}), signer)
    assert att.verify(env, key, DIGEST, att.SBOM)["predicate"] == {"bomFormat": "CycloneDX"}
    with pytest.raises(att.AttestationError, match="signature does not verify"):
        att.verify(env, other, DIGEST, att.SBOM)
    with pytest.raises(att.AttestationError, match="not " + DIGEST.replace("1", "2")):
        att.verify(env, key, DIGEST.replace("1", "2"), att.SBOM)
    with pytest.raises(att.AttestationError, match="signed predicate type"):
        att.verify(env, key, DIGEST, att.PROVENANCE)
    doc = json.loads(env)
    doc["payload"] = base64.b64encode(b'{"_type":"https://in-toto.io/Statement/v1"}').decode()
    with pytest.raises(att.AttestationError, match="signature does not verify"):
        att.verify(json.dumps(doc).encode(), key, DIGEST, att.SBOM)
    with pytest.raises(att.AttestationError, match="not a DSSE envelope"):
        att.verify(b"{}", key, DIGEST, att.SBOM)


def test_a_bad_key_is_refused_before_any_build(tmp_path, capsys):
    (tmp_path / "k.pem").write_text("not a key")
    assert (
        main(
            [
                "--matrix",
                "--select",
                "name=openmpi5.0.11-cuda13.0-cudnn9-debian12",
                "--sign-key",
                str(tmp_path / "k.pem"),
            ]
        )
        != 0
    )
    assert "--sign-key signs what --push publishes" in capsys.readouterr().err
    assert (
        main(
            [
                "--matrix",
                "--push",
                "--registry",
                "127.0.0.1:5000/t",
                "--select",
                "name=openmpi5.0.11-cuda13.0-cudnn9-debian12",
                "--sign-key",
                str(tmp_path / "k.pem"),
            ]
        )
        != 0
    )
    assert "not a usable PEM private key" in capsys.readouterr().err
    assert main(["verify-attestations", "127.0.0.1:5000/t/x:latest"]) != 0
    assert "needs --public-key" in capsys.readouterr().err


def test_ci_subject_is_what_the_publish_report_pushed(tmp_path, monkeypatch):
    docs = tmp_path / "supply" / "cellA" / LOCK["tag"]
    docs.mkdir(parents=True)
    (docs / "inputs.lock.json").write_text(json.dumps(LOCK))
    (docs / "sbom.cdx.json").write_text("{}")
    monkeypatch.setattr("trainbase_common.engine.inspect_image", lambda ref: SimpleNamespace(labels=LABELS))
    report = tmp_path / "publish.json"
    report.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "name": "cellA",
                        "tag": LOCK["tag"],
                        "image": "trainbase/cellA:x",
                        "platform": "linux/amd64",
                        "repo_digest": DIGEST,
                        "pushed": [f"ghcr.io/example/staging/cellA:{LOCK['tag']}"],
                    }
                ]
            }
        )
    )
    got = attest.github_subject(report, tmp_path / "supply", tmp_path / "attest")
    assert got["subject-name"] == "ghcr.io/example/staging/cellA" and got["subject-digest"] == DIGEST
    assert (
        json.loads((tmp_path / "attest" / "provenance.slsa.json").read_text())["buildDefinition"]["buildType"]
        == att.BUILD_TYPE
    )
    assert got["twin-digest"] == ""
    report.write_text(json.dumps({"cells": [{"name": "cellA", "repo_digest": None, "pushed": []}]}))
    assert attest.github_subject(report, tmp_path / "supply", tmp_path / "attest") == {}


class FakeReferrers:
    """The registry as github_subject asks it: which keyless bundles each digest carries."""

    def __init__(self, attested: dict[str, set[str]], tags: dict[str, str]):
        self.attested, self.tags, self.asked = attested, tags, []

    def referrers(self, repo, digest, artifact_type=""):
        self.asked.append(digest)
        assert artifact_type == attest.KEYLESS_BUNDLE
        return [
            SimpleNamespace(annotations={attest.SIGSTORE_PREDICATE_ANNOTATION: p})
            for p in self.attested.get(digest, ())
        ]

    def descriptor(self, repo, ref):
        return SimpleNamespace(digest=self.tags[ref])


def test_ci_attests_a_published_digest_its_first_run_left_unattested_and_the_zstd_twin(tmp_path, monkeypatch):
    """The run that pushed the tag failed at its attestation step; its re-run finds the tag
    already published. That digest (and its zstd twin, what latest-zstd points to) must still be
    attested -- and a digest that carries both attestations is not attested twice."""
    docs = tmp_path / "supply" / "cellA" / LOCK["tag"]
    docs.mkdir(parents=True)
    (docs / "inputs.lock.json").write_text(json.dumps(LOCK))
    (docs / "sbom.cdx.json").write_text("{}")
    monkeypatch.setattr("trainbase_common.engine.inspect_image", lambda ref: SimpleNamespace(labels=LABELS))
    twin = "sha256:" + "7" * 64
    tag = f"ghcr.io/example/cellA:{LOCK['tag']}"
    report = tmp_path / "publish.json"
    report.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "name": "cellA",
                        "tag": LOCK["tag"],
                        "image": "trainbase/cellA:x",
                        "platform": "linux/amd64",
                        "repo_digest": DIGEST,
                        "pushed": [],
                        "already_published": [tag, tag + "-zstd"],
                    }
                ]
            }
        )
    )
    both = set(att.PREDICATES)
    registry = FakeReferrers({DIGEST: {"https://slsa.dev/provenance/v1"}}, {LOCK["tag"] + "-zstd": twin})
    got = attest.github_subject(report, tmp_path / "supply", tmp_path / "attest", client_for=lambda host: registry)
    assert got["subject-name"] == "ghcr.io/example/cellA"
    assert got["subject-digest"] == DIGEST and got["twin-digest"] == twin, (
        "a half-attested digest and an unattested twin"
    )
    registry.attested = {DIGEST: both}
    got = attest.github_subject(report, tmp_path / "supply", tmp_path / "attest", client_for=lambda host: registry)
    assert got["subject-digest"] == "" and got["twin-digest"] == twin
    registry.attested = {DIGEST: both, twin: both}
    assert (
        attest.github_subject(report, tmp_path / "supply", tmp_path / "attest", client_for=lambda host: registry) == {}
    )


def test_publishing_jobs_sign_keyless_and_pull_requests_cannot():
    steps = yaml.safe_load((ROOT / ".github/workflows/build-cells.yml").read_text())["jobs"]["cell"]["steps"]
    attests = [s for s in steps if str(s.get("uses", "")).startswith("actions/attest@")]
    assert {s["with"]["predicate-type"] for s in attests} == set(att.PREDICATES)
    assert all(s["with"]["push-to-registry"] is True and "inputs.publish" in s["if"] for s in attests)
    build = yaml.safe_load((ROOT / ".github/workflows/build.yml").read_text())["jobs"]
    for name, job in build.items():
        if name.startswith("build-level"):
            assert job["permissions"].get("id-token") == "write" and job["permissions"].get("attestations") == "write"
    ci = yaml.safe_load((ROOT / ".github/workflows/ci.yml").read_text())
    assert "id-token: write" not in (ROOT / ".github/workflows/ci.yml").read_text()
    assert all(j.get("with", {}).get("publish") in (None, False) for j in ci["jobs"].values())
