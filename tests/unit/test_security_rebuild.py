"""Security rebuilds without a recipe edit (trainbase/supply/security_check.py,
trainbase/define/security_rebuilds.py): a published image's SBOM against its distro's security
suite index finds the fixes it misses; the row's rebuild epoch renders one ARG before the
os block's upgrade, so exactly that row's cells (and their children) get new tags."""

import json
import lzma
import shutil
from datetime import date

import pytest

from trainbase.define import security_rebuilds
from trainbase.define.matrix import load
from trainbase.errors import TrainbaseError
from trainbase.render import recipes
from trainbase.supply import security_check

from .conftest import ROOT

SBOM = next((ROOT / "reports" / "supply").glob("openmpi4.1.4-cuda12.8-cudnn9-debian12/*/sbom.cdx.json"), None)


def _sbom(tmp_path, debs: dict[str, str]):
    doc = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "metadata": {
            "component": {
                "name": "openmpi4.1.4-cuda12.8-cudnn9-debian12",
                "properties": [
                    {"name": "trainbase:components.os.id", "value": "debian12"},
                    {"name": "trainbase:os.ID", "value": "debian"},
                    {"name": "trainbase:os.VERSION_CODENAME", "value": "bookworm"},
                ],
            }
        },
        "components": [
            {"name": n, "version": v, "purl": f"pkg:deb/debian/{n}@{v}?arch=amd64&distro=debian-12"}
            for n, v in debs.items()
        ],
    }
    p = tmp_path / "sbom.cdx.json"
    p.write_text(json.dumps(doc))
    return p


def _index(packages: dict[str, str]):
    text = "".join(f"Package: {n}\nVersion: {v}\nArchitecture: amd64\n\n" for n, v in packages.items())
    seen = []

    def fetch(url):
        seen.append(url)
        return lzma.compress(text.encode() if url.split("/")[-3] == "main" else b"")

    return fetch, seen


def test_a_fix_in_the_security_suite_the_image_misses_is_found(tmp_path, capsys):
    sbom = _sbom(tmp_path, {"openssh-client": "1:9.2p1-2+deb12u9", "libssl3": "3.0.22-1~deb12u2", "zlib1g": "1:1.2.13"})
    fetch, seen = _index({"openssh-client": "1:9.2p1-2+deb12u10", "libssl3": "3.0.17-1~deb12u1", "other": "1"})
    rows = security_check.check([sbom], date(2026, 11, 26), fetch=fetch)
    assert rows == {
        "debian12": {
            "epoch": "2026-11-26",
            "fixes": ["openssh-client 1:9.2p1-2+deb12u9 -> 1:9.2p1-2+deb12u10 (bookworm-security)"],
        }
    }
    assert seen == ["http://deb.debian.org/debian-security/dists/bookworm-security/main/binary-amd64/Packages.xz"]
    assert "1 security fix(es) pending of 3" in capsys.readouterr().out
    fetch, _ = _index({"openssh-client": "1:9.2p1-2+deb12u9"})  # an older suite version is no fix
    assert security_check.check([sbom], date(2026, 11, 26), fetch=fetch) == {}


def test_an_sbom_or_index_that_cannot_be_read_is_an_error_not_a_pass(tmp_path):
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TrainbaseError, match="not a trainbase SBOM"):
        security_check.read_sbom(tmp_path / "bad.json")
    with pytest.raises(TrainbaseError, match="names no Debian packages"):
        security_check.read_sbom(_sbom(tmp_path, {}))

    def unreachable(url):
        return security_check._fetch("http://127.0.0.1:9/none")

    with pytest.raises(TrainbaseError, match="nothing was checked"):
        security_check.check([_sbom(tmp_path, {"zlib1g": "1"})], date(2026, 11, 26), fetch=unreachable)


@pytest.mark.skipif(SBOM is None, reason="no SBOM of a local build under reports/supply")
def test_a_real_sbom_reads_as_one_debian_image():
    f = security_check.read_sbom(SBOM)
    assert (f.os_row, f.os_id, f.codename, f.arch) == ("debian12", "debian", "bookworm", "amd64")
    assert len(f.debs) > 100 and "libc6" in f.debs


def test_the_epoch_gives_exactly_that_rows_cells_and_children_new_tags(tmp_path):
    for part in ("matrix.yaml", "templates", "imagefs", "locks", "patches"):
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, tmp_path / part)
        elif src.exists():
            shutil.copy(src, tmp_path / part)
    m = load(tmp_path / "matrix.yaml")
    before = recipes.render_all(m, root=tmp_path)
    security_rebuilds.write(tmp_path, {"debian12": {"epoch": "2026-11-26", "fixes": ["openssh-client a -> b"]}})
    after = recipes.render_all(load(tmp_path / "matrix.yaml"), root=tmp_path)
    moved = {n for n in before if before[n].tag != after[n].tag}
    assert moved == {n for n, r in before.items() if r.cell.os == "debian12"}
    roots = [r for n, r in after.items() if r.cell.os == "debian12" and not r.cell.parent]
    assert roots and all("ARG TRAINBASE_SECURITY_REBUILD=2026-11-26\nRUN" in r.files[r.dockerfile] for r in roots)
    assert any(r.cell.parent for n, r in after.items() if n in moved), "children follow their parent"
    (tmp_path / security_rebuilds.FILE).write_text('{"schema": 1, "os": {"debian12": {"epoch": "soon"}}}')
    with pytest.raises(TrainbaseError, match="security-rebuilds.json"):
        security_rebuilds.load(tmp_path)


def test_the_first_week_nothing_published_is_said_and_the_refresh_goes_on(tmp_path, monkeypatch, capsys):
    """A new registry has no `latest` anywhere: the refresh's security step says so and exits 0
    (it once failed the job there, so week 1's refresh never opened its pull request); naming
    nothing at all is still a usage error."""
    from trainbase.deliver import attest, security_rebuild

    asked = []
    monkeypatch.setattr(attest, "fetch_sboms", lambda m, root, selected, reg, out_dir, **kw: asked.append(reg) or [])
    assert security_rebuild.main(["--registry", "ghcr.io/acme/trainbase", "--profile", "ci", "--root", str(ROOT)]) == 0
    assert asked == ["ghcr.io/acme/trainbase"]
    assert "nothing published under ghcr.io/acme/trainbase yet" in capsys.readouterr().out
    assert security_rebuild.main(["--root", str(ROOT)]) == 2
    assert "nothing to check" in capsys.readouterr().err
