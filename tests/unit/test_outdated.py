"""`build.py --outdated`: every PyPI pin of matrix.yaml found (package lists and the CUDA wheel
tables), compared with PyPI's releases -- the newest of the pin's own series and the newest
overall, pre-releases and yanked files left out -- without changing anything."""

from trainbase.define import outdated

from .conftest import ROOT


def test_every_kind_of_pin_in_matrix_yaml_is_found():
    found = {(p.package, p.version): p.where for p in outdated.pins(ROOT / "matrix.yaml")}
    assert any(pkg == "impi-rt" for pkg, _ in found) and any(pkg == "mpi4py" for pkg, _ in found)
    assert any(pkg == "nvidia-nccl-cu13" for pkg, _ in found)  # {package:, version:} tables
    assert any(pkg == "torch" for pkg, _ in found) and any(pkg == "setuptools" for pkg, _ in found)
    assert all(where for where in found.values())


def test_a_series_bump_and_a_newer_series_are_told_apart(tmp_path):
    m = tmp_path / "matrix.yaml"
    m.write_text(
        "mpi:\n  x:\n    packages: [impi-rt==2021.18.1, mpi4py==4.1.1]\n"
        "cuda:\n  '13.0':\n    wheels:\n      nccl: {package: nvidia-nccl-cu13, version: 2.30.7}\n"
    )
    releases = {
        "impi-rt": ["2021.18.0", "2021.18.1", "2021.19.0", "2021.20.0rc1"],
        "mpi4py": ["4.1.0", "4.1.1"],
        "nvidia-nccl-cu13": ["2.30.7", "2.30.9", "2.32.3"],
    }
    findings = {f.pin.package: f for f in outdated.check(m, releases.__getitem__)}
    assert (findings["impi-rt"].newest_in_series, findings["impi-rt"].newest) == (None, "2021.19.0")  # no rc
    assert (findings["mpi4py"].newest_in_series, findings["mpi4py"].newest) == (None, None)
    assert (findings["nvidia-nccl-cu13"].newest_in_series, findings["nvidia-nccl-cu13"].newest) == ("2.30.9", "2.32.3")
    rows = {r["package"]: r for r in outdated.as_json(list(findings.values()))}
    assert rows["nvidia-nccl-cu13"] == {
        "package": "nvidia-nccl-cu13",
        "pinned": "2.30.7",
        "newest_in_series": "2.30.9",
        "newest": "2.32.3",
        "where": ["cuda.13.0.wheels.nccl"],
    }
    text = outdated.report(list(findings.values()))
    assert text.startswith("2 of 3 pins have newer releases") and "current: mpi4py" in text
    assert "| impi-rt | 2021.18.1 | - | 2021.19.0 | mpi.x.packages[0] |" in text


def test_a_held_pin_is_reported_held_with_its_reason_not_behind(tmp_path):
    """matrix.yaml's holds: releases a stated rule keeps out (a known regression, an upstream
    incompatibility) are listed as held, with the reason; what the hold allows still counts."""
    m = tmp_path / "matrix.yaml"
    m.write_text(
        "mpi:\n  x:\n    packages: [impi-rt==2021.18.1, setuptools==80.9.0, mpi4py==4.1.0]\n"
        "holds:\n"
        "  - {package: setuptools, below: '81', reason: Horovod's setup.py imports pkg_resources,"
        " upstream: 'https://github.com/horovod/horovod/issues/0'}\n"
        "  - {package: impi-rt, reason: the DeepSpeed patch is proven on 2021.18 only}\n"
    )
    releases = {
        "impi-rt": ["2021.18.1", "2021.19.0"],
        "setuptools": ["80.9.0", "80.10.1", "84.2.1"],
        "mpi4py": ["4.1.0", "4.1.1"],
    }
    findings = {f.pin.package: f for f in outdated.check(m, releases.__getitem__)}
    # setuptools: 84.2.1 held; 80.10.1 is under the hold's bound, so the pin is still behind
    assert (
        findings["setuptools"].newest == "80.10.1"
        and "84.2.1 held (>= 81): Horovod's setup.py" in findings["setuptools"].held
        and "issues/0" in findings["setuptools"].held
    )
    assert findings["impi-rt"].newest is None and findings["impi-rt"].held.startswith("2021.19.0 held: the DeepSpeed")
    assert "setuptools" not in {p.package for p in outdated.pins(m) if p.where == ["holds[0]"]}
    text = outdated.report(list(findings.values()))
    assert text.startswith("2 of 3 pins have newer releases on PyPI; 2 hold(s)")
    assert "| impi-rt | 2021.18.1 | 2021.19.0 held: the DeepSpeed patch is proven on 2021.18 only |" in text
    assert outdated.as_json([findings["impi-rt"]])[0]["held"].startswith("2021.19.0 held")


def test_matrix_yaml_holds_are_validated():
    import pytest
    from pydantic import ValidationError

    from trainbase.define.schema import Hold

    with pytest.raises(ValidationError):
        Hold(package="torch", below="two", reason="x")
    with pytest.raises(ValidationError):
        Hold(package="torch", below="2.16")  # a hold without its reason


def test_a_package_pypi_cannot_answer_for_is_a_line_not_a_crash(tmp_path):
    m = tmp_path / "matrix.yaml"
    m.write_text("python:\n  packages: [mpi4py==4.1.1]\n")

    def down(name):
        raise ConnectionError("pypi.org unreachable")

    (f,) = outdated.check(m, down)
    assert "ConnectionError" in f.error and "? (ConnectionError" in outdated.report([f])


def test_a_lock_for_a_python_the_host_lacks_is_resolved_wheels_only_with_the_tool_s_own_python(monkeypatch):
    """Debian 12 has Python 3.11 only; the images' 3.12 sets are then resolved by this tool's
    interpreter with pip's target options (what another architecture's set uses), and a set
    that needs an sdist says which interpreter to install."""
    import sys

    from trainbase.define import pip_locks
    from trainbase.errors import TrainbaseError

    def missing(version):
        raise TrainbaseError(f"no python{version}")

    monkeypatch.setattr(pip_locks, "find_python", missing)
    ls = pip_locks.LockSet("pytorch-py3.12", "3.12", ("torch==2.15.0",), ())
    py, options = pip_locks.resolver_for(ls)
    assert py == sys.executable
    assert options[:1] == ["--only-binary=:all:"] and "3.12" in options and "cp312" in options
    monkeypatch.setattr(pip_locks, "find_python", lambda v: "/opt/py312/bin/python")
    assert pip_locks.resolver_for(ls) == ("/opt/py312/bin/python", [])


def test_a_series_hold_and_a_scoped_hold(tmp_path):
    """A CUDA row pins its own CUDA release's wheels: `series: true` holds the newer series (a
    newer CUDA is a new row) while a release in the pin's series is still a bump; `where`
    limits a hold to the pins under one path (the row whose PyTorch pins the library exactly)."""
    m = tmp_path / "matrix.yaml"
    m.write_text(
        "cuda:\n"
        "  '12.8': {wheels: {cudart: {package: nvidia-cuda-runtime-cu12, version: 12.8.90},"
        " cublas: {package: nvidia-cublas-cu12, version: 12.8.4.1}}}\n"
        "  '12.9': {wheels: {cublas: {package: nvidia-cublas-cu12, version: 12.9.1.4}}}\n"
        "holds:\n"
        "  - {package: [nvidia-cuda-runtime-cu12, nvidia-cublas-cu12], where: cuda, series: true,"
        " reason: a newer CUDA is a new row}\n"
        "  - {package: nvidia-cublas-cu12, where: cuda.12.8, reason: torch 2.10.0 pins it exactly}\n"
    )
    releases = {
        "nvidia-cuda-runtime-cu12": ["12.8.57", "12.8.90", "12.9.79"],
        "nvidia-cublas-cu12": ["12.8.4.1", "12.8.5.5", "12.9.1.4", "12.9.3.13"],
    }
    found = {(f.pin.package, f.pin.version): f for f in outdated.check(m, releases.__getitem__)}
    runtime = found["nvidia-cuda-runtime-cu12", "12.8.90"]
    assert runtime.newest is None and runtime.held == "12.9.79 held (outside its series): a newer CUDA is a new row"
    pinned_by_torch = found["nvidia-cublas-cu12", "12.8.4.1"]  # both holds: the series one, then the exact one
    assert pinned_by_torch.newest is None and "12.8.5.5 held: torch 2.10.0 pins it exactly" in pinned_by_torch.held
    row_129 = found["nvidia-cublas-cu12", "12.9.1.4"]  # only the series hold reaches it
    assert row_129.newest == row_129.newest_in_series == "12.9.3.13" and not row_129.held
    from trainbase.define.schema import Hold

    assert Hold(package=["a", "b"], series=True, reason="x").package == ["a", "b"]


def test_one_version_pinned_by_a_held_row_and_a_free_row_is_behind_on_the_free_row(tmp_path):
    """Two CUDA rows pin the same cuDNN; a hold scoped to the first row (its PyTorch requires
    exactly that version) must not hide that the second row, which no hold covers, is behind."""
    m = tmp_path / "matrix.yaml"
    m.write_text(
        "cuda:\n"
        "  '12.8':\n    wheels:\n      cudnn: {package: nvidia-cudnn-cu12, version: 9.10.2.21}\n"
        "  '12.9':\n    wheels:\n      cudnn: {package: nvidia-cudnn-cu12, version: 9.10.2.21}\n"
        "holds:\n"
        "  - {package: nvidia-cudnn-cu12, where: cuda.12.8, reason: torch requires exactly this}\n"
    )
    findings = outdated.check(m, {"nvidia-cudnn-cu12": ["9.10.2.21", "9.28.0.42"]}.__getitem__)
    by_where = {tuple(f.pin.where): f for f in findings}
    assert set(by_where) == {("cuda.12.8.wheels.cudnn",), ("cuda.12.9.wheels.cudnn",)}
    assert by_where[("cuda.12.8.wheels.cudnn",)].newest is None
    assert by_where[("cuda.12.8.wheels.cudnn",)].held.startswith("9.28.0.42 held: torch requires")
    assert by_where[("cuda.12.9.wheels.cudnn",)].newest == "9.28.0.42"
    assert not by_where[("cuda.12.9.wheels.cudnn",)].held
    assert outdated.report(findings).startswith("1 of 2 pins have newer releases")
