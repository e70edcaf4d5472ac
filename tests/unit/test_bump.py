"""`build.py --bump`: a series bump written into matrix.yaml's text (comments kept), refused
whole when it makes a cell impossible, held pins left alone, newer series named for a person,
then locks re-resolved and the cells whose tags move printed."""

from __future__ import annotations

import io

import pytest
import yaml

from trainbase.define import outdated
from trainbase.errors import TrainbaseError
from trainbase.render import bump

RELEASES = {"psutil": ["7.2.2", "7.2.3", "8.0.0"], "pyyaml": ["6.0.3", "6.0.4"]}


def _releases(name):
    return RELEASES.get(name, [])


def test_apply_rewrites_list_pins_and_wheel_tables_and_keeps_comments():
    text = (
        "a: [psutil==7.2.2, pyyaml==6.0.3]  # why\n"
        "b: {package: nvidia-nccl-cu12, version: 2.27.5}\n"
        "c: [notpsutil==7.2.2]\n"
    )
    edits = [bump.Edit("psutil", "7.2.2", "7.2.3", ["a[0]"]), bump.Edit("nvidia-nccl-cu12", "2.27.5", "2.27.7", ["b"])]
    assert bump.apply(text, edits) == (
        "a: [psutil==7.2.3, pyyaml==6.0.3]  # why\n"
        "b: {package: nvidia-nccl-cu12, version: 2.27.7}\n"
        "c: [notpsutil==7.2.2]\n"
    )
    with pytest.raises(TrainbaseError, match="edit it by hand"):
        bump.apply(text, [bump.Edit("mpi4py", "4.1.1", "4.1.2", ["x"])])


def test_plan_bumps_the_series_names_a_newer_series_and_keeps_a_hold(tmp_path):
    m = tmp_path / "matrix.yaml"
    m.write_text(
        "x:\n  packages: [psutil==7.2.2, pyyaml==6.0.3]\nholds:\n  - {package: pyyaml, reason: a regression in 6.0.4}\n"
    )
    edits, notes = bump.plan(outdated.check(m, _releases), [])
    assert [(e.package, e.new) for e in edits] == [("psutil", "7.2.3")]
    assert any("psutil 7.2.2: newer series 8.0.0: `--bump psutil` writes it" in n for n in notes)
    assert any("pyyaml 6.0.3: 6.0.4 held: a regression in 6.0.4" in n for n in notes)
    # named on the command line: its newest release, past its series
    assert [(e.package, e.new) for e in bump.plan(outdated.check(m, _releases), ["psutil"])[0]] == [("psutil", "8.0.0")]
    with pytest.raises(TrainbaseError, match="pins no torchvision"):
        bump.plan(outdated.check(m, _releases), ["torchvision"])


def test_a_bump_writes_matrix_yaml_relocks_renders_and_names_the_moved_cells(workdir, monkeypatch):
    from trainbase.define import pip_locks

    # PyPI's resolver stood in for: each stale set resolves to its pins with a made-up hash
    monkeypatch.setattr(
        pip_locks,
        "resolve",
        lambda ls, log=print: (
            pip_locks.header(ls) + "".join(f"{r.lower()} \\\n    --hash=sha256:{'0' * 64}\n" for r in ls.requirements)
        ),
    )
    out = io.StringIO()
    code = bump.command(workdir / "matrix.yaml", [], False, out, releases=_releases)
    text = out.getvalue()
    assert code == 0, text
    assert "bump: psutil 7.2.2 -> 7.2.3" in text and "newer series 8.0.0" in text
    assert "psutil==7.2.3" in (workdir / "matrix.yaml").read_text()
    assert "lock file(s) re-resolved" in text
    moved = [line.split(":")[0].strip() for line in text.splitlines() if " -> r" in line]
    # psutil is Horovod's pin: the Horovod cells move, and nothing else
    assert moved and all(name.startswith("horovod") for name in moved), text


def test_a_bump_that_makes_a_cell_impossible_is_refused_and_writes_nothing(workdir):
    """An NCCL wheel bumped alone no longer agrees with its row's `nccl` and the framework
    releases' pins: the bump is refused naming the cells and the rule, matrix.yaml untouched."""
    path = workdir / "matrix.yaml"
    # without matrix.yaml's holds (one keeps this NCCL where torch pins it): the rule is the test
    path.write_text(path.read_text().split("\nholds:", 1)[0] + "\n")
    data = yaml.safe_load(path.read_text())
    # a CUDA row a PyTorch release lists (found in the matrix: any version may come or go)
    row = next(
        c for c in data["axes"]["cuda"] if any(c in r["cuda"] for r in data["frameworks"]["pytorch"]["releases"])
    )
    nccl = data["cuda"][row]["wheels"]["nccl"]
    before = path.read_text()
    # another row whose NCCL wheel is the same package at another version, pinned by no release
    # (a CUDA row added for older fleets) would move: its bump is accepted and written, the
    # refused one by name (the command's rule); then only a dry run keeps this test offline
    others = [
        k
        for k, r in data["cuda"].items()
        if k != row
        and r["wheels"]["nccl"]["package"] == nccl["package"]
        and r["wheels"]["nccl"]["version"] != nccl["version"]
        and tuple(map(int, r["wheels"]["nccl"]["version"].split("."))) < (2, 27, 7)  # what the bump moves
    ]
    out = io.StringIO()
    code = bump.command(
        path,
        [nccl["package"]],
        bool(others),
        out,
        releases=lambda name: [nccl["version"], "2.27.7"] if name == nccl["package"] else [],
    )
    text = out.getvalue()
    # the row's `nccl:` moves with its wheel; PyTorch 2.9.1's own NCCL pin then refuses it
    assert (
        code == 1
        and f"REFUSED {nccl['package']} {nccl['version']} -> 2.27.7:" in text
        and f"pins NCCL {nccl['version']} but CUDA {row} rows ship NCCL 2.27.7" in text
    ), text
    assert path.read_text() == before


def test_an_nccl_wheel_bump_moves_its_row_s_nccl_where_no_framework_pins_it(tmp_path):
    """The 12.9 row has no PyTorch release: its NCCL wheel and its `nccl:` are one fact, bumped
    together (only that row's; another row pinning the same version keeps it)."""
    text = (
        'cuda:\n  "12.8":\n    nccl: 2.27.7  # why\n'
        "    wheels:\n      nccl: {package: nvidia-nccl-cu12, version: 2.27.7}\n"
        '  "12.9":\n    toolkit: 12.9.1\n    nccl: 2.27.7\n'
        "    wheels:\n      nccl: {package: nvidia-nccl-cu12, version: 2.27.7}\n"
        "frameworks: {}\n"
    )
    edit = bump.Edit("nvidia-nccl-cu12", "2.27.7", "2.32.3", ["cuda.12.9.wheels.nccl"])
    after = bump.apply(text, [edit])
    row_128, row_129 = after.split('"12.9"')
    assert row_128 == text.split('"12.9"')[0]  # comment, wheel and nccl: untouched
    assert yaml.safe_load(after)["cuda"]["12.9"]["nccl"] == "2.32.3"
    assert yaml.safe_load(after)["cuda"]["12.9"]["wheels"]["nccl"]["version"] == "2.32.3"


def test_a_pin_is_rewritten_only_where_it_is_pinned():
    """The same cuDNN on two rows, the first held: bumping the second leaves the first alone
    (it once rewrote both, and torch's exact pin on the held row then failed to resolve)."""
    text = (
        'cuda:\n  "12.8":\n    wheels: {cudnn: {package: nvidia-cudnn-cu12, version: 9.10.2.21}}\n'
        '  "12.9":\n    wheels: {cudnn: {package: nvidia-cudnn-cu12, version: 9.10.2.21}}\n'
        "x: [psutil==7.2.2]\ny: [psutil==7.2.2]\n"
    )
    after = yaml.safe_load(
        bump.apply(
            text,
            [
                bump.Edit("nvidia-cudnn-cu12", "9.10.2.21", "9.28.0.42", ["cuda.12.9.wheels.cudnn"]),
                bump.Edit("psutil", "7.2.2", "7.2.3", ["y[0]"]),
            ],
        )
    )
    assert after["cuda"]["12.8"]["wheels"]["cudnn"]["version"] == "9.10.2.21"
    assert after["cuda"]["12.9"]["wheels"]["cudnn"]["version"] == "9.28.0.42"
    assert (after["x"], after["y"]) == (["psutil==7.2.2"], ["psutil==7.2.3"])


def test_a_bump_pip_cannot_resolve_restores_matrix_yaml_and_every_lock(workdir, monkeypatch):
    from trainbase.define import pip_locks

    before = {f.name: f.read_bytes() for f in (workdir / "locks").glob("*")}
    matrix_before = (workdir / "matrix.yaml").read_text()
    calls = []

    def resolve(ls, log=print):  # the first set resolves (and is written), the next one conflicts
        calls.append(ls.name)
        if len(calls) > 1:
            raise TrainbaseError(f"lock {ls.name}: pip could not resolve psutil==7.2.3: conflict")
        return pip_locks.header(ls)

    monkeypatch.setattr(pip_locks, "resolve", resolve)
    with pytest.raises(TrainbaseError, match="(?s)REFUSED, matrix.yaml and locks/ restored.*conflict"):
        bump.command(
            workdir / "matrix.yaml",
            ["psutil"],
            False,
            io.StringIO(),
            releases=lambda n: ["7.2.2", "7.2.3"] if n == "psutil" else [],
        )
    assert len(calls) >= 2  # every stale set is resolved before any is written, each failure named (issue 65)
    assert (workdir / "matrix.yaml").read_text() == matrix_before
    assert {f.name: f.read_bytes() for f in (workdir / "locks").glob("*")} == before
