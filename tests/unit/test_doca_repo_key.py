"""The DOCA rows' repository key is the key that signs the pinned DOCA repository (issue 71).

Since 2026-01 NVIDIA signs every DOCA repository (2.9.x to 3.4.x) with the "NVIDIA DOCA Host"
key, published beside the packages as doca_keyring.gpg; GPG-KEY-Mellanox.pub still carries only
the retired Mellanox keys. A pin of the old key renders, lints and passes tb-fetch-openpgp-key
(the file does hold it), and then every DOCA cell stops at `apt-get update` with
NO_PUBKEY DC726C5E41B9CC50. Upstream evidence: Azure/AgentBaker #9256 (the key, its fingerprint,
"every ubuntu24.04 DOCA version ... is now signed by this key"), NVIDIA/cuda-quantum #5456,
microsoft/superbenchmark's DOCA 3.2.3 Dockerfile (its key from doca_keyring.gpg)."""

from __future__ import annotations

import pytest

from trainbase.define.matrix import load

from .conftest import ROOT

# (DOCA version prefix, OS family) -> long key ID of the key apt must have, as users' apt logs
# and the pull requests above report it. A new DOCA release or a key rotation is a row here.
REPOSITORY_SIGNERS = {
    ("2.9", "ubuntu"): "DC726C5E41B9CC50",
    ("3.", "ubuntu"): "DC726C5E41B9CC50",
}
# where NVIDIA publishes that key for a DOCA repository
KEY_FILE = "doca_keyring.gpg"


@pytest.fixture(scope="module")
def spec():
    return load(ROOT / "matrix.yaml").spec


def _signer(version: str, family: str) -> str:
    hits = [k for (v, f), k in REPOSITORY_SIGNERS.items() if version.startswith(v) and f == family]
    assert hits, f"no recorded signer for DOCA {version} on {family}: record it in REPOSITORY_SIGNERS"
    return hits[0]


def test_the_pinned_key_is_the_one_that_signs_the_pinned_repository(spec):
    checked = 0
    for key, row in spec.ib.items():
        if row.kind != "doca-ofed":
            continue
        artifact = spec.artifacts[row.key]
        for family in {spec.os[o].family for o in spec.axes.os if spec.os[o].family == "ubuntu"}:
            signer = _signer(row.version, family)
            assert artifact.openpgp_fingerprint.endswith(signer), (
                f"ib.{key} (DOCA {row.version}) pins {artifact.openpgp_fingerprint}, but its repository is "
                f"signed by {signer}: apt-get update stops with NO_PUBKEY {signer}"
            )
            checked += 1
    assert checked


def test_the_key_is_fetched_from_the_file_that_publishes_it(spec):
    for row in spec.ib.values():
        if row.kind == "doca-ofed":
            url = spec.artifacts[row.key].url
            assert url.endswith("/" + KEY_FILE), f"{url}: the DOCA Host key is published as {KEY_FILE}"
            assert f"/doca/{row.version}/" in url, f"{url} is not the pinned DOCA {row.version} repository's"


def test_the_recipe_before_issue_71_is_refused():
    """591e86f's pin: the Mellanox key from GPG-KEY-Mellanox.pub."""
    old = "CAE649B3B3929F8470D4D33BA024F6F0E6D6A281"
    assert not old.endswith(_signer("3.2.3", "ubuntu"))
    rendered = (ROOT / "images" / "openmpi4.1.8-doca3.2-cuda12.8-cudnn9-ubuntu24.04" / "Dockerfile").read_text()
    assert old not in rendered and "70454E6BF5D9C2D3B78709E8DC726C5E41B9CC50" in rendered
