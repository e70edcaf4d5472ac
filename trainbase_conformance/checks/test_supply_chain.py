"""The image says exactly what is in it: it carries a CycloneDX SBOM named by its labels, and
that SBOM lists exactly the Debian packages dpkg has and the Python distributions the image's
own Python sees (a stale or borrowed SBOM fails), with the manifest's NCCL and MPI in it."""

import hashlib
import json
import re

import pytest

PYPI_LIST = (
    "import importlib.metadata as m, json; print(json.dumps(sorted({(d.metadata['Name'], d.version) "
    "for d in m.distributions() if d.metadata['Name']})))"
)

pytestmark = pytest.mark.trainbase_contract("the SBOM its labels name")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sbom(target) -> dict:
    if "sbom" not in target.cache:
        path, digest = target.labels.get("io.trainbase.sbom"), target.labels.get("io.trainbase.sbom.sha256")
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
@pytest.mark.trainbase_contract("the OCI revision/created/source labels trainbase's build writes")
def test_image_says_which_commit_built_it_and_when(target):
    """org.opencontainers.image.revision is the commit the recipe was built from (40 hex digits),
    created an RFC 3339 UTC time, and source, where present, a URL without credentials: what a
    user checks before pulling (docs/supply-chain.md) and what ties an image to its recipe."""
    labels = target.labels
    revision = labels.get("org.opencontainers.image.revision", "")
    assert re.fullmatch(r"[0-9a-f]{40}", revision), f"revision label {revision!r} is not a commit"
    created = labels.get("org.opencontainers.image.created", "")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created), f"created label {created!r}"
    source = labels.get("org.opencontainers.image.source")
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
def test_sbom_names_the_manifests_nccl_and_mpi(target):
    doc = _sbom(target)
    nccl = target.components["nccl"]
    assert _purls(doc, "pypi").get(_norm(nccl["package"])) == nccl["version"], "NCCL wheel missing or other version"
    mpi = target.components["mpi"]
    names = {**_purls(doc, "generic"), **_purls(doc, "pypi")}
    want = {"openmpi": "openmpi", "intelmpi": "impi-rt"}[mpi["kind"]]
    assert names.get(want) == mpi["version"], f"{want} {mpi['version']} not in the SBOM: {sorted(names)[:20]}"
