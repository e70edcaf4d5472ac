"""tb-fetch-openpgp-key: a repository signing key is kept only if it is the key matrix.yaml pins
by its OpenPGP identity (how the DOCA rows pin NVIDIA's Mellanox key). Run against keys made
here with gpg, so every refusal is seen, not assumed."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT

TOOL = ROOT / "imagefs" / "usr" / "local" / "bin" / "tb-fetch-openpgp-key"
pytestmark = pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed on this host")


def make_key(home: Path, uid: str) -> tuple[str, Path]:
    """A fresh ed25519 signing key: (fingerprint, armored public key file)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(
        [
            "gpg",
            "--batch",
            "--quiet",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            uid,
            "ed25519",
            "sign",
            "1d",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    cols = subprocess.run(
        ["gpg", "--batch", "--with-colons", "--fingerprint", "--list-keys", uid],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    fpr = next(ln.split(":")[9] for ln in cols.splitlines() if ln.startswith("fpr:"))
    out = home / f"{fpr}.asc"
    out.write_bytes(
        subprocess.run(["gpg", "--batch", "--armor", "--export", fpr], env=env, check=True, capture_output=True).stdout
    )
    return fpr, out


def fetch(key: Path, pin: str, keyring: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(TOOL), f"file://{key}", pin, str(keyring)],
        capture_output=True,
        text=True,
        env={**os.environ, "GNUPGHOME": "/nonexistent"},
        check=False,
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpg")
    yield {
        "repo": make_key(d / "a", "Repo Signing <repo@example.invalid>"),
        "other": make_key(d / "b", "Someone Else <else@example.invalid>"),
    }
    # key generation starts a gpg-agent per home that outlives the test run otherwise
    for home in (d / "a", d / "b"):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, check=False)


def test_the_pinned_key_by_full_fingerprint_is_kept(keys, tmp_path):
    fpr, asc = keys["repo"]
    r = fetch(asc, fpr, tmp_path / "repo.gpg")
    assert r.returncode == 0, r.stderr
    assert f"is OpenPGP key {fpr}" in r.stdout
    listed = subprocess.run(
        [
            "gpg",
            "--batch",
            "--with-colons",
            "--no-default-keyring",
            "--keyring",
            str(tmp_path / "repo.gpg"),
            "--homedir",
            str(tmp_path),
            "--list-keys",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    assert fpr in listed


def test_the_pinned_key_by_long_key_id_is_kept(keys, tmp_path):
    fpr, asc = keys["repo"]
    r = fetch(asc, fpr[-16:].lower(), tmp_path / "repo.gpg")  # case does not matter
    assert r.returncode == 0, r.stderr


def test_another_key_is_refused_with_expected_and_actual(keys, tmp_path):
    fpr, _ = keys["repo"]
    other, asc = keys["other"]
    r = fetch(asc, fpr[-16:], tmp_path / "repo.gpg")
    assert r.returncode == 1
    assert f"key mismatch for file://{asc}: expected {fpr[-16:]}, got {other}" in r.stderr
    assert not (tmp_path / "repo.gpg").exists()


def keyring_fingerprints(keyring: Path, home: Path) -> list[str]:
    cols = subprocess.run(
        [
            "gpg",
            "--batch",
            "--with-colons",
            "--homedir",
            str(home),
            "--no-default-keyring",
            "--keyring",
            str(keyring),
            "--fingerprint",
            "--list-keys",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    lines = cols.splitlines()
    return [
        lines[i + 1].split(":")[9]
        for i, ln in enumerate(lines[:-1])
        if ln.startswith("pub:") and lines[i + 1].startswith("fpr:")
    ]


def test_from_a_file_of_several_keys_only_the_pinned_one_is_kept(keys, tmp_path):
    """Mellanox's key file also holds retired keys: only the pinned one may reach the keyring."""
    fpr, asc = keys["repo"]
    both = tmp_path / "both.asc"
    both.write_bytes(keys["other"][1].read_bytes() + asc.read_bytes())
    r = fetch(both, fpr, tmp_path / "repo.gpg")
    assert r.returncode == 0, r.stderr
    home = tmp_path / "list"
    home.mkdir(mode=0o700)
    assert keyring_fingerprints(tmp_path / "repo.gpg", home) == [fpr]


def test_a_file_of_other_keys_is_refused(keys, tmp_path):
    other, asc = keys["other"]
    r = fetch(asc, "CAE649B3B3929F8470D4D33BA024F6F0E6D6A281", tmp_path / "repo.gpg")
    assert r.returncode == 1 and f"expected CAE649B3B3929F8470D4D33BA024F6F0E6D6A281, got {other}" in r.stderr


def test_not_a_key_and_a_bad_pin_are_refused(keys, tmp_path):
    junk = tmp_path / "junk.asc"
    junk.write_text("<html>404</html>\n")
    r = fetch(junk, keys["repo"][0], tmp_path / "repo.gpg")
    assert r.returncode == 1 and "holds no OpenPGP key" in r.stderr
    r = fetch(keys["repo"][1], "A024F6F0", tmp_path / "repo.gpg")  # a short key ID: too weak
    assert r.returncode == 2 and "neither a 40-digit fingerprint nor a 16-digit long key ID" in r.stderr
