"""Holds name what they are about (a release by its version, a CUDA row by its key), never a
list position (issue 65): inserting a release, oldest first as matrix.yaml asks, once moved
each hold and its reason onto another release, and `build.py outdated` then reported the held
release's neighbour as held for the wrong reason. A hold whose subject is gone, or that no
longer matches a pin, fails every command that loads the matrix (`check` among them), quoting
the hold's reason."""

from __future__ import annotations

import yaml

from trainbase.define import outdated

from .conftest import run_cli


def _release_holds(data: dict) -> list[dict]:
    return [h for h in data.get("holds") or [] if "[version=" in str(h.get("where", ""))]


def _insert_oldest_release(data: dict, version: str = "1.0.0") -> None:
    """A release older than every other, first in the list (as matrix.yaml orders them)."""
    releases = data["frameworks"]["pytorch"]["releases"]
    releases.insert(0, dict(releases[0], version=version, packages=[f"torch=={version}"]))


def test_matrix_yaml_names_every_release_it_holds_by_version(matrix_data):
    assert _release_holds(matrix_data), "matrix.yaml has no hold on a framework release to test with"
    for h in matrix_data["holds"]:
        assert not outdated.POSITION.search(str(h.get("where", ""))), h
    assert outdated.hold_problems(matrix_data) == []


def test_a_hold_stays_on_its_release_when_an_older_release_is_inserted(workdir):
    path = workdir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    _insert_oldest_release(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert outdated.hold_problems(data) == []

    newest = "99.0.0"
    versions = [r["version"] for r in data["frameworks"]["pytorch"]["releases"]]
    findings = outdated.check(path, lambda package: [*versions, newest])
    by_version = {f.pin.version: f for f in findings if f.pin.package == "torch"}
    assert by_version["1.0.0"].newest == newest and not by_version["1.0.0"].held  # no hold is about it
    for h in (h for h in _release_holds(data) if h["where"].startswith("frameworks.pytorch.")):
        version = h["where"].split("[version=", 1)[1].split("]", 1)[0]
        held = by_version[version]
        assert held.newest is None, f"torch {version}: reported behind though {h['where']} holds it"
        assert " ".join(h["reason"].split()) in held.held, (version, held.held)


def test_a_positional_where_is_refused_naming_the_form_to_use(workdir, capsys):
    path = workdir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    _release_holds(data)[0]["where"] = "frameworks.pytorch.releases[0]"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli(["check", "--file", str(path)], capsys)
    assert code == 2 and "names a list position" in err and "releases[version=X.Y.Z]" in err, out + err


def test_a_hold_on_a_release_that_is_gone_fails_check_with_its_reason(workdir, capsys):
    path = workdir / "matrix.yaml"
    data = yaml.safe_load(path.read_text())
    hold = _release_holds(data)[0]
    hold["where"] = "frameworks.pytorch.releases[version=0.0.1]"  # a release the matrix does not have
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run_cli(["check", "--file", str(path)], capsys)
    assert code == 2, out + err
    assert "releases[version=0.0.1]" in err and "names nothing" in err
    assert " ".join(hold["reason"].split()) in err


def test_a_hold_whose_packages_are_no_longer_pinned_there_is_stale():
    data = {
        "cuda": {"12.8": {"wheels": {"cudnn": {"package": "nvidia-cudnn-cu12", "version": "9.10.2.21"}}}},
        "python": {"packages": ["numpy==2.5.1"]},
        "holds": [
            {"package": "nvidia-nccl-cu12", "where": "cuda.12.8", "reason": "torch pins it exactly"},
            {"package": "numpy", "below": "2.5", "reason": "numpy 2.5 needs Python 3.12"},
            {"package": "nvidia-cudnn-cu12", "where": "cuda.12.8", "reason": "kept"},
        ],
    }
    problems = outdated.hold_problems(data)
    assert len(problems) == 2, problems
    assert "holds[0]" in problems[0] and "pins none of its packages" in problems[0] and "torch pins it" in problems[0]
    assert "holds[1]" in problems[1] and "past 2.5" in problems[1] and "Python 3.12" in problems[1]


def test_where_resolves_dotted_keys_and_named_list_items():
    data = {"cuda": {"12.8": {"x": 1}}, "frameworks": {"p": {"releases": [{"version": "1"}, {"version": "2"}]}}}
    assert outdated.resolve_where(data, "cuda.12.8") == "cuda.12.8"
    assert outdated.resolve_where(data, "frameworks.p.releases[version=2]") == "frameworks.p.releases[1]"
    assert outdated.resolve_where(data, "frameworks.p.releases[version=3]") is None
    assert outdated.resolve_where(data, "cuda.12.9") is None
