"""Adding a CUDA version and dropping one, as docs/matrix.md says, on a scratch copy (issue 65):
the offline commands go through, a new cell is reported as new, and every leftover of the
dropped version (its `cuda.` table, a release still listing it, a hold on its row) is named
until it is gone. The versions are found in the matrix, never named here, so the matrix may
gain or lose any version and this stays green. Also the wording the issue found: the hints
name the interpreter the user ran, `explain` echoes the name it was given, and the catalogue
sorts versions as versions."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from trainbase.define.invocation import build_py
from trainbase.define.matrix import load
from trainbase.render.catalogue import natural

from .conftest import run_cli

NEW_CUDA, NEW_RELEASE = "99.1", "99.1.0"  # versions no real matrix will have


def _add_cuda_with_one_release(data: dict) -> None:
    """A CUDA row made from the newest one, on the axis, and one PyTorch release built for it."""
    newest = data["axes"]["cuda"][-1]
    data["cuda"][NEW_CUDA] = dict(data["cuda"][newest])
    data["axes"]["cuda"].append(NEW_CUDA)
    releases = data["frameworks"]["pytorch"]["releases"]
    template = next(r for r in releases if newest in r["cuda"])
    packages = [p for p in template["packages"] if not p.startswith("torch==")]
    releases.append(dict(template, version=NEW_RELEASE, cuda=[NEW_CUDA], packages=[f"torch=={NEW_RELEASE}", *packages]))


def _drop_from_axis(data: dict) -> str:
    """What a person does first: take the oldest CUDA off the axis (and out of the profiles,
    which `build.py` refuses to leave naming cells that are gone)."""
    gone = data["axes"]["cuda"].pop(0)
    for profile in data["profiles"].values():
        if "cells" in profile:
            profile["cells"] = [c for c in profile["cells"] if f"-cuda{gone}-" not in c]
            if not profile["cells"]:
                profile.pop("cells")
                profile["select"] = {"framework": ["none"]}
    return gone


def _clean_up(data: dict, gone: str) -> None:
    """What the warnings ask for: the table, the releases' lists, the holds on the row (and a
    release left with no CUDA, with what names it)."""
    data["cuda"].pop(gone)
    for table in data["frameworks"].values():
        kept = []
        for r in table.get("releases") or []:
            r["cuda"] = [c for c in r["cuda"] if c != gone]
            if r["cuda"]:
                kept.append(r)
            else:
                data["holds"] = [h for h in data["holds"] if f"[version={r['version']}]" not in str(h.get("where"))]
        if "releases" in table:
            table["releases"] = kept
    data["holds"] = [h for h in data["holds"] if h.get("where") != f"cuda.{gone}"]
    # a framework built on a release that is gone goes too (Horovod/DeepSpeed `requires`)
    versions = {fw: {r["version"] for r in t.get("releases") or []} for fw, t in data["frameworks"].items()}
    for table in data["frameworks"].values():
        if "releases" in table:
            table["releases"] = [
                r for r in table["releases"] if all(v in versions[p] for p, v in (r.get("requires") or {}).items())
            ]
    # a framework left with no release leaves the matrix (the load's error names it)
    for fw in [fw for fw, t in data["frameworks"].items() if "releases" in t and not t["releases"]]:
        del data["frameworks"][fw]
        data["axes"]["framework"].remove(fw)
        data["holds"] = [h for h in data["holds"] if not str(h.get("where", "")).startswith(f"frameworks.{fw}.")]
        data["rules"] = [r for r in data.get("rules") or [] if fw not in str(r.get("when")) + str(r.get("require"))]
        for profile in data["profiles"].values():
            sel = profile.get("select") or {}
            if fw in (sel.get("framework") or []):
                sel["framework"].remove(fw)
            if profile.get("cells"):
                profile["cells"] = [c for c in profile["cells"] if not c.startswith(fw)]
                if not profile["cells"]:
                    profile.pop("cells")
                    profile["select"] = {"framework": ["none"]}


def _write(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_add_a_cuda_row_with_a_release_then_drop_one(workdir, capsys):
    path = workdir / "matrix.yaml"
    arg = ["--file", str(path)]
    data = yaml.safe_load(path.read_text())

    _add_cuda_with_one_release(data)
    _write(path, data)
    code, out, err = run_cli(["list", "--select", f"cuda={NEW_CUDA}", *arg], capsys)
    assert code == 0 and f"pytorch{NEW_RELEASE}-" in out, err
    code, out, err = run_cli(["render", *arg], capsys)
    assert code == 1 and "lock" in err  # the new release's pip sets wait for `build.py lock` (PyPI)
    assert f"  new      pytorch{NEW_RELEASE}-" in out and f"-cuda{NEW_CUDA}-" in out
    assert not [line for line in out.splitlines() if line.startswith("  changed") and f"cuda{NEW_CUDA}" in line]
    assert "leftover" not in err

    gone = _drop_from_axis(data)
    _write(path, data)
    code, out, err = run_cli(["render", *arg], capsys)
    leftovers = [line for line in err.splitlines() if "leftover of a dropped version" in line]
    assert f"cuda.{gone}: no value of axes.cuda uses it" in err, err
    listed = any(gone in r["cuda"] for t in data["frameworks"].values() for r in t.get("releases") or [])
    assert any(f"lists CUDA {gone}" in line for line in leftovers) == listed, err
    assert any(f"where: cuda.{gone}" in line for line in leftovers) == any(
        h.get("where") == f"cuda.{gone}" for h in data["holds"]
    )
    code, out, err = run_cli(["check", *arg], capsys)
    assert "leftover of a dropped version" in err  # check says it too

    _clean_up(data, gone)
    _write(path, data)
    code, out, err = run_cli(["render", *arg], capsys)
    assert "leftover" not in err and "removed" in out, err
    m = load(path)
    assert gone not in m.spec.axes.cuda and not m.leftovers()
    assert not any(f"-cuda{gone}-" in c.name for c in m.cells)


def test_a_hold_on_a_cuda_row_whose_table_is_gone_fails_with_its_reason(workdir, capsys):
    path = workdir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    hold = next((h for h in data["holds"] if str(h.get("where", "")).startswith("cuda.")), None)
    assert hold, "matrix.yaml holds no CUDA row"
    gone = hold["where"].removeprefix("cuda.")
    data["axes"]["cuda"].remove(gone)
    for profile in data["profiles"].values():
        if any(f"-cuda{gone}-" in c for c in profile.get("cells") or []):
            profile.pop("cells")
            profile["select"] = {"framework": ["none"]}
    _clean_up(data, gone)  # everything but the hold
    data["holds"].append(hold)
    _write(path, data)
    code, out, err = run_cli(["check", "--file", str(path)], capsys)
    assert code == 2 and f"where: cuda.{gone}" in err and " ".join(hold["reason"].split()) in err, out + err


def test_hints_name_the_interpreter_the_user_ran(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    assert build_py() == ".venv/bin/python build.py"
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    assert build_py() == "python3 build.py"


def test_explain_echoes_the_name_it_was_given(capsys):
    from trainbase.define.matrix import load as load_matrix

    from .conftest import ROOT

    m = load_matrix(ROOT / "matrix.yaml")
    releases = m.spec.frameworks["pytorch"].releases
    cuda = next((c for c in m.spec.axes.cuda if not any(c in r.cuda for r in releases)), None)
    if cuda is None:  # every CUDA has a PyTorch release: ask for one the axis lacks on a real cell
        return
    base = next(
        c for c in m.included if c.framework == "none" and c.cuda == cuda and c.platform == m.spec.axes.platform[0]
    )
    asked = f"pytorch{releases[0].version}-{base.name}"
    code, out, err = run_cli(["explain", asked, "--file", str(ROOT / "matrix.yaml")], capsys)
    assert code == 0 and out.startswith(f"{asked}: EXCLUDED"), out + err


def test_the_catalogue_sorts_versions_as_versions():
    names = ["pytorch2.15.0-x", "pytorch2.7.1-x", "pytorch2.10.0-x"]
    assert sorted(names, key=natural) == ["pytorch2.7.1-x", "pytorch2.10.0-x", "pytorch2.15.0-x"]


def test_no_entry_of_matrix_yaml_borrows_from_another_by_a_yaml_alias():
    """Dropping CUDA 12.9 once meant deleting the table that defined `&gpu-architectures`, and
    the next load stopped at "found undefined alias" in the 13.x rows. Each versioned entry
    states its own values, so any one can be deleted alone."""
    import yaml as pyyaml

    from .conftest import ROOT

    events = pyyaml.parse((ROOT / "matrix.yaml").read_text())
    anchored = [e.anchor for e in events if getattr(e, "anchor", None)]
    assert not anchored, f"matrix.yaml defines YAML anchors {anchored}: write the value out in each entry"
