"""Hygiene: nothing of the build machine is published. Every layer is inspected (the local
engine's layer folders, or `docker save`: trainbase_common.layers), not just the final filesystem: a file deleted by a later layer still
ships in the earlier one; and for private keys the content of every small file of the final
filesystem too, whatever its name or folder. Also: labels equal the manifest, size within its
budget."""

import posixpath
import re
from pathlib import Path

import pytest

from trainbase_common.manifest import labels as labels_from_manifest
from trainbase_conformance.containers import short_name
from trainbase_conformance.layers import (
    LayerScan,
    has_private_key,
    pem_certificates,
    record_hashes,
    scan_layers,
    shipped_sha256,
    wheel_digest,
)

CONTENT_DIRS = (
    "etc/ssl/",
    "etc/pki/",
    "etc/ssh/",
    "root/",
    "home/",
    "tmp/",
    "run/",
    "var/tmp/",
    "usr/local/share/ca-certificates/",
    "usr/share/ca-certificates/",
)
CONTENT_NAMES = re.compile(
    r"(\.(pem|crt|cer|key)$|cacert|ca-bundle|ca-certificates|(^|/)id_\w+$|ssh_host_|"
    r"\.dist-info/RECORD$|(^|/)conda-meta/[^/]+\.json$)"
)
LOCAL_ANCHORS = ("usr/local/share/ca-certificates/", "etc/pki/ca-trust/source/anchors/")
PRIVATE_KEY_NAME = re.compile(r"(^|/)(ssh_host_\w+_key|id_(rsa|dsa|ecdsa|ed25519)(_sk)?)$")
PIP_CACHE = re.compile(r"^(root|home/[^/]+)/\.cache/pip/.|(^|/)pkgs/[^/]+\.(conda|tar\.bz2)$")
APT_LISTS = re.compile(r"^var/lib/apt/lists/(?!(lock|partial/?|auxfiles/?)$).+|^var/cache/apt/(.+\.deb|\w+\.bin)$")
# The layers' contents are read only in the folders and names above; a key can be anywhere (a
# PEM key pasted into /opt/app/config.json). So the final filesystem is also grepped, in one
# pass inside the container: every regular file up to 1 MiB (a key is a few KiB; a config or
# script embedding one is rarely bigger; -I skips binaries at their first NUL byte), /proc, /sys,
# /dev and other mounts left out. Each match comes back with its SHA-256, so that a file exactly
# as an installed package shipped it (a test fixture, public with the package) is told from
# one the build wrote (the RECORDs and conda-meta files above say how each package shipped its
# files; CPython's test suite carries keycert.pem, cryptography's ssh.py the OpenSSH header as a
# constant). "scanned N exit R" per grep batch proves the scan read the filesystem (R: grep's
# status, 0 or 1 = read, 2 = some file unreadable or gone meanwhile, more = grep did not run).
KEY_HEADER = "-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"  # PEM (RSA, EC, DSA, PKCS#8, ENCRYPTED) and OpenSSH
KEY_SCAN = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -size -1025k -print0 "
    '| xargs -0 -r sh -c \'LC_ALL=C grep -lIsZE -e "$0" -- "$@"; echo "scanned $# exit $?" >&2\' '
    f"'{KEY_HEADER}' | xargs -0 -r sha256sum"
)
SCANNED = re.compile(r"scanned (\d+) exit (\d+)")


def _want(path: str, size: int) -> bool:
    return size <= 4 << 20 and (path.startswith(CONTENT_DIRS) or bool(CONTENT_NAMES.search(path)))


@pytest.fixture
def layers(target) -> LayerScan:
    if "layers" not in target.cache:
        target.cache["layers"] = scan_layers(target.ref, _want)
    return target.cache["layers"]


def _real(files):
    """Entries that put content in a layer (not whiteout markers of deletions)."""
    return [f for f in files if ".wh." not in posixpath.basename(f.path)]


def _report(scan: LayerScan, bad, what: str) -> str:
    return f"{len(bad)} {what} in the image's layers:\n" + "\n".join(scan.where(f) for f in bad[:15])


def _host_local_cas() -> set[str]:
    """Certificates this build host trusts beyond its distro's set (e.g. an intercepting
    proxy's CA, which builds use through a secret): they must never reach a layer."""
    local: set[str] = set()
    for p in Path("/usr/local/share/ca-certificates").rglob("*.crt"):
        local |= pem_certificates(p.read_bytes())
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.exists():
        distro: set[str] = set()
        for p in Path("/usr/share/ca-certificates").rglob("*.crt"):
            distro |= pem_certificates(p.read_bytes())
        local |= pem_certificates(bundle.read_bytes()) - distro
    return local


@pytest.mark.static
@pytest.mark.evidence("content")
def test_no_foreign_ca_certificates(target, layers):
    """Every certificate in any layer is one of ca-certificates' own, or sits in a file
    exactly as an installed wheel shipped it (its RECORD hash, e.g. pip's vendored certifi);
    no local trust anchors; none of this host's own CAs."""
    files = _real(layers.files)
    own: set[str] = set()
    for f in files:
        if f.path.startswith("usr/share/ca-certificates/") and f.content:
            own |= pem_certificates(f.content)
    records: dict[str, str] = {}
    for f in files:
        if f.path.endswith(".dist-info/RECORD") and f.content:
            records.update(record_hashes(f.content, posixpath.dirname(posixpath.dirname(f.path))))
    host_cas = _host_local_cas()
    bad = [f for f in files if f.path.startswith(LOCAL_ANCHORS) and f.kind == "file"]
    problems = [f"{layers.where(f)}: a local trust anchor" for f in bad]
    for f in files:
        if not f.content or f.path.startswith("usr/share/ca-certificates/"):
            continue
        certs = pem_certificates(f.content)
        if certs & host_cas:
            problems.append(
                f"{layers.where(f)}: {len(certs & host_cas)} certificate(s) of this build host's "
                "local CAs (the build's CA bundle leaked)"
            )
            continue
        extra = certs - own
        if extra and records.get(posixpath.normpath(f.path)) != wheel_digest(f.content):
            problems.append(f"{layers.where(f)}: {len(extra)} certificate(s) that ca-certificates does not ship")
    assert not problems, f"{len(problems)} CA problem(s):\n" + "\n".join(problems[:15])


@pytest.mark.static
@pytest.mark.evidence("content")
def test_no_run_secrets(target, layers):
    """Nothing under /run/secrets in any layer (build secrets are mounts, never files)."""
    bad = [f for f in _real(layers.files) if f.path.startswith("run/secrets/") and f.path != "run/secrets/"]
    assert not bad, _report(layers, bad, "entries under /run/secrets")


@pytest.mark.static
@pytest.mark.evidence("content")
def test_no_private_keys(target, layers):
    """No SSH host key, no client key, no PEM private key in any layer (by name anywhere, by
    content in the folders and names the layer scan reads), and no PEM or OpenSSH private key
    in the content of any small file of the final filesystem (KEY_SCAN) but a file exactly as an
    installed wheel or conda package shipped it."""
    files = _real(layers.files)
    bad = [
        f
        for f in files
        if (PRIVATE_KEY_NAME.search(f.path) and f.kind in ("file", "link"))
        or (f.content and has_private_key(f.content))
    ]
    r = target.sh(KEY_SCAN, timeout=900)
    batches = [(int(m[1]), int(m[2])) for m in SCANNED.finditer(r.stderr)]
    scanned = sum(n for n, rc in batches if rc <= 2)
    assert scanned > 1000 and all(rc <= 2 for _, rc in batches), (
        f"the key scan read {scanned} files of the filesystem (exit {r.rc}; files and grep's exit per batch: "
        f"{batches}): {r.stderr.strip()[-600:]}"
    )
    shipped = shipped_sha256(files)
    loose = sorted(
        p
        for p, digest in key_scan_matches(r.stdout).items()
        if digest not in shipped.get(posixpath.normpath(p.lstrip("/")), ())
    )
    problems = ([_report(layers, bad, "private keys")] if bad else []) + (
        [
            f"{len(loose)} file(s) in the image's filesystem hold a private key (a PEM or OpenSSH header) that no "
            "installed wheel or conda package shipped:\n" + "\n".join(loose[:15])
        ]
        if loose
        else []
    )
    assert not problems, "\n".join(problems)


def key_scan_matches(sha256sum_output: str) -> dict[str, str]:
    """KEY_SCAN's output (`sha256sum` lines): path -> SHA-256 (hex). sha256sum marks a name
    holding a backslash or newline with a leading backslash: such a name is kept as printed."""
    out = {}
    for line in sha256sum_output.splitlines():
        digest, _, path = line.lstrip("\\").partition("  ")
        if re.fullmatch(r"[0-9a-f]{64}", digest) and path:
            out[path] = digest
    return out


@pytest.mark.static
@pytest.mark.evidence("content")
def test_no_pip_cache(target, layers):
    """No pip cache (/root/.cache/pip) or conda package tarballs in any layer."""
    bad = [f for f in _real(layers.files) if PIP_CACHE.search(f.path)]
    assert not bad, _report(layers, bad, "package-cache entries")


@pytest.mark.static
@pytest.mark.evidence("content")
def test_no_apt_lists(target, layers):
    """No apt package lists or downloaded .debs in any layer."""
    bad = [f for f in _real(layers.files) if APT_LISTS.search(f.path) and f.kind != "dir"]
    assert not bad, _report(layers, bad, "apt lists/archives")


# labels the build sets from its own provenance, not from the manifest
PROVENANCE_LABELS = ("io.trainbase.base.", "io.trainbase.recipe", "io.trainbase.sbom")


@pytest.mark.static
@pytest.mark.evidence("content")
@pytest.mark.trainbase_contract("the io.trainbase.* labels")
def test_labels_match_manifest(target):
    """The io.trainbase.* labels say what the image's manifest says, both ways: every label the
    manifest implies is there with its value, and no io.trainbase.* label claims what the
    manifest does not (a framework label a derived image inherited from its parent, say) --
    only the build's provenance labels (base.*, recipe, sbom*) come from elsewhere."""
    want = labels_from_manifest(target.manifest)
    have = target.labels
    wrong = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    assert not wrong, "labels (image, manifest) that disagree: " + ", ".join(
        f"{k}: {h!r} != {w!r}" for k, (h, w) in wrong.items()
    )
    extra = {
        k: v
        for k, v in have.items()
        if k.startswith("io.trainbase.") and k not in want and not k.startswith(PROVENANCE_LABELS)
    }
    assert not extra, f"labels the manifest does not account for: {extra}"


@pytest.mark.static
@pytest.mark.evidence("content")
@pytest.mark.trainbase_contract("/etc/trainbase/manifest.json")
def test_manifest_names_this_image(target):
    """The manifest's name is the image's name (its repository and its title label)."""
    name = target.manifest.get("name")
    repo = short_name(target.ref).split(":")[0].split("@")[0]
    title = target.labels.get("org.opencontainers.image.title")
    assert title == name, f"title label {title!r}, manifest name {name!r}"
    assert repo == name, f"image {target.ref} carries the manifest of {name!r}"


@pytest.mark.static
@pytest.mark.evidence("content")
@pytest.mark.trainbase_contract("the manifest's size budget")
def test_size_within_budget(target):
    """The image is no larger than the manifest's size_budget_gb (decimal GB, like docker)."""
    budget = float(target.manifest["size_budget_gb"])
    size = target.inspect["Size"] / 1e9
    assert size <= budget, f"image is {size:.2f} GB, budget {budget:g} GB"
