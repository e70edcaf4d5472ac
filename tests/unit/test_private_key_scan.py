"""test_no_private_keys' scan of the final filesystem (KEY_SCAN: one find + grep in the container)
run here over a planted tree: a key in a JSON config under /opt is found whatever its name, binaries
and files over 1 MiB are not read, and a file exactly as a wheel or conda package shipped it (a
test fixture) is told apart by its SHA-256 (layers.shipped_sha256)."""

import base64
import hashlib
import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_hygiene as hygiene
from trainbase_conformance.layers import LayerFile, LayerScan, conda_meta_hashes, shipped_sha256

# built here, never written whole in the repository, so no secret scanner takes this file for a leak
BEGIN = "-----BEGIN " + "PRIVATE KEY-----"
PEM = f"{BEGIN}\nMC4CAQAwBQYDK2VwBCIEIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n-----END " + "PRIVATE KEY-----\n"
OPENSSH = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    files = {
        "opt/x/config.json": json.dumps({"endpoint": "https://example.invalid", "tls_key": PEM}),
        "home/u/my keys/deploy": OPENSSH,
        "usr/lib/libx.so": "\x7fELF\x00\x00" + PEM,  # a binary: skipped at its NUL
        "var/big.txt": "x" * (1 << 20) + PEM,  # over 1 MiB: not read
        "usr/lib/python3/dist-packages/rx.py": 'KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")',
        "etc/plain.conf": "nothing here",
        "venv/site-packages/pkg/tests/key.pem": PEM,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode("latin-1"))
    return root


@pytest.mark.skipif(not all(shutil.which(p) for p in ("find", "xargs", "grep", "sha256sum")), reason="GNU tools")
def test_the_scan_finds_a_key_by_its_content_anywhere(tree):
    cmd = hygiene.KEY_SCAN.replace("find / ", f"find {tree} ", 1)
    assert cmd != hygiene.KEY_SCAN
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    found = hygiene.key_scan_matches(r.stdout)
    assert sorted(p[len(str(tree)) + 1 :] for p in found) == [
        "home/u/my keys/deploy",
        "opt/x/config.json",
        "venv/site-packages/pkg/tests/key.pem",
    ]
    config = (tree / "opt/x/config.json").read_bytes()
    assert found[f"{tree}/opt/x/config.json"] == hashlib.sha256(config).hexdigest()
    # every regular file up to 1 MiB was handed to grep, which ran and said so
    assert [(int(n), int(rc)) for n, rc in hygiene.SCANNED.findall(r.stderr)] == [(6, 0)]


def test_sha256sum_lines_are_read_with_odd_names():
    line = "a" * 64 + "  /opt/x/config.json\n\\" + "b" * 64 + "  /odd\\\\name\nnot a line"
    assert hygiene.key_scan_matches(line) == {"/opt/x/config.json": "a" * 64, "/odd\\\\name": "b" * 64}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_a_wheels_or_conda_packages_own_file_is_known_byte_for_byte():
    fixture = PEM.encode()
    record = (f"pkg/tests/key.pem,sha256={_b64(fixture)},{len(fixture)}\npkg/__init__.py,,\n").encode()
    meta = json.dumps(
        {
            "paths_data": {
                "paths": [
                    {
                        "_path": "lib/python3.12/test/keycert.pem",
                        "sha256": hashlib.sha256(b"k").hexdigest(),
                        "sha256_in_prefix": hashlib.sha256(b"k2").hexdigest(),
                    },
                    {"_path": "bin/python3.12", "path_type": "hardlink"},
                ]
            }
        }
    ).encode()
    files = [
        LayerFile(3, "venv/site-packages/pkg-1.0.dist-info/RECORD", "file", len(record), record),
        LayerFile(2, "opt/conda/conda-meta/python-3.12.0-h1.json", "file", len(meta), meta),
        LayerFile(2, "opt/conda/conda-meta/history", "file", 3, b"x y"),
    ]
    shipped = shipped_sha256(files)
    assert shipped["venv/site-packages/pkg/tests/key.pem"] == {hashlib.sha256(fixture).hexdigest()}
    assert shipped["opt/conda/lib/python3.12/test/keycert.pem"] == {
        hashlib.sha256(b"k").hexdigest(),
        hashlib.sha256(b"k2").hexdigest(),
    }
    assert "opt/conda/bin/python3.12" not in shipped and "venv/site-packages/pkg/__init__.py" not in shipped
    assert conda_meta_hashes(b"not json", "opt/conda") == {}
    # the layer scan reads conda's package records as it reads wheels' RECORDs
    assert hygiene._want("opt/conda/conda-meta/python-3.12.0-h1.json", 1 << 20)


# ----------------------------------------------------------------------------- the check itself


class TreeImage:
    """An image whose final filesystem is ``root``: `target.sh` runs the check's KEY_SCAN over it
    (find's root moved), or answers ``scan`` as given (stdout, stderr, exit code)."""

    def __init__(self, root, scan: tuple[str, str, int] | None = None):
        self.root, self.scan = root, scan

    def sh(self, cmd, timeout=None):
        if self.scan is not None:
            out, err, rc = self.scan
            return SimpleNamespace(rc=rc, stdout=out, stderr=err)
        assert cmd == hygiene.KEY_SCAN
        r = subprocess.run(
            ["sh", "-c", cmd.replace("find / ", f"find {self.root} ", 1)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return SimpleNamespace(rc=r.returncode, stdout=r.stdout, stderr=r.stderr)


def layer_scan(*files: LayerFile) -> LayerScan:
    return LayerScan(
        "trainbase/fake:r1", ["l1.tar", "l2.tar"], ["RUN apt-get install -y openssh-server", "COPY . /opt"], list(files)
    )


@pytest.fixture
def clean_root(tmp_path):
    """A filesystem of 1100 small files without a key (the scan must have read over 1000)."""
    root = tmp_path / "clean"
    for i in range(1100):
        (root / f"d{i // 100}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i // 100}" / f"f{i}.conf").write_text(f"setting_{i} = {i}\n")
    return root


@pytest.mark.skipif(not all(shutil.which(p) for p in ("find", "xargs", "grep", "sha256sum")), reason="GNU tools")
def test_the_check_passes_a_clean_image_and_fails_a_key_in_its_filesystem(clean_root):
    hygiene.test_no_private_keys(TreeImage(clean_root), layer_scan())
    (clean_root / "d3" / "app.json").write_text(json.dumps({"tls_key": PEM}))
    with pytest.raises(
        AssertionError,
        match=r"1 file\(s\) in the image's filesystem hold a private key .*\n"
        r"\s*\S*/d3/app\.json",
    ):
        hygiene.test_no_private_keys(TreeImage(clean_root), layer_scan())


@pytest.mark.skipif(not all(shutil.which(p) for p in ("find", "xargs", "grep", "sha256sum")), reason="GNU tools")
def test_the_check_fails_an_ssh_host_key_in_a_layer(clean_root):
    """A key the final filesystem no longer holds (deleted by a later layer) is still in its layer."""
    key = LayerFile(0, "etc/ssh/ssh_host_ed25519_key", "file", 411, None)
    with pytest.raises(
        AssertionError,
        match=r"1 private keys in the image's layers:\n\s*/etc/ssh/ssh_host_ed25519_key "
        r"\(layer 1/2: RUN apt-get install -y openssh-server\)",
    ):
        hygiene.test_no_private_keys(TreeImage(clean_root), layer_scan(key))


def test_the_check_fails_when_the_scan_read_almost_nothing(tmp_path):
    """find stopped at the first unreadable folder: 12 files read, no key among them, and the
    check must not take that for a clean image."""
    with pytest.raises(
        AssertionError,
        match=r"the key scan read 12 files of the filesystem \(exit 1; .*\[\(12, 0\)\]\): "
        r"find: '/root': Permission denied",
    ):
        hygiene.test_no_private_keys(
            TreeImage(tmp_path, ("", "find: '/root': Permission denied\nscanned 12 exit 0\n", 1)), layer_scan()
        )
