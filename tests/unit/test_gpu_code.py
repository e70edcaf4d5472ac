"""Which GPUs an image is built for (issue 73): the frameworks' wheels' own GPU code in the matrix,
CUDA's rules for where code runs (trainbase_common/gpu_code.py), the cells refused where a
release's wheel is a CPU build, the catalogue's "built for" and "tested on" columns, and the
static check that holds an image's wheels to what the manifest declares.

The wheels' answers are what the locked wheels hold (read 2026-12-03 from the wheel files by the
sha256 in locks/: torch/version.py, torch/lib/libtorch_python.so's arch-flag string, TensorFlow's
tensorflow/python/platform/build_info.py) and, for torch 2.10.0 x86_64, what the built
pytorch2.10.0-openmpi4.1.4 image's torch._C._cuda_getArchFlags() printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainbase.define.matrix import load
from trainbase.render import catalogue
from trainbase_common import gpu_code
from trainbase_conformance.checks import test_frameworks as fw

from .conftest import ROOT
from .framework_fakes import FakeTarget

TORCH_2_10_X86 = "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
TF_2_21_X86 = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
TF_CELL = "tensorflow2.21.0-openmpi4.1.4-cuda12.8-cudnn9-debian12"
PT_CELL = "pytorch2.10.0-openmpi4.1.4-cuda12.8-cudnn9-debian12"


# ----------------------------------------------------------------------------- CUDA's rules


@pytest.mark.parametrize(
    "codes, arch, how",
    [
        (["sm_80"], "8.6", gpu_code.MACHINE_CODE),  # a minor up, the same major
        (["sm_80"], "9.0", None),  # never across majors
        (["sm_86"], "8.0", None),  # never down
        (["sm_90a"], "9.0", gpu_code.MACHINE_CODE),
        (["sm_100a"], "10.3", None),  # architecture-specific: its own GPU only
        (["sm_100f"], "10.3", gpu_code.MACHINE_CODE),  # family-specific: its family's newer GPUs
        (["compute_90"], "12.0", gpu_code.PTX),  # PTX JIT-compiles upward
        (["compute_90"], "8.9", None),
        (["sm_80", "compute_90"], "9.0", gpu_code.PTX),
        (TF_2_21_X86, "8.6", gpu_code.MACHINE_CODE),
    ],
)
def test_code_runs_where_cudas_compatibility_rules_say(codes, arch, how):
    assert gpu_code.runs_as(codes, arch) == how


def test_a_string_that_is_no_gpu_code_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'sm90' is not GPU code"):
        gpu_code.runs_as(["sm90"], "9.0")


def test_built_for_says_ptx_only_gpus_and_the_reason_for_each_refused_one():
    served, not_for = gpu_code.built_for(
        ["8.0", "9.0", "10.0", "12.0"], {"tensorflow": TF_2_21_X86}, {"10.0": "XLA", "12.0": "XLA"}
    )
    assert served == [("8.0", gpu_code.MACHINE_CODE), ("9.0", "PTX (tensorflow)")]
    assert not_for == {"10.0": "XLA", "12.0": "XLA"}
    served, not_for = gpu_code.built_for(["8.0", "9.0"], {"x": ["sm_80"]}, {})
    assert served == [("8.0", gpu_code.MACHINE_CODE)]
    assert not_for == {"9.0": "x carries no code for compute capability 9.0"}


# ----------------------------------------------------------------------------- the matrix


def test_the_arm64_cells_of_cpu_only_wheels_are_refused_with_the_reason():
    """What a Grace Hopper user met: PyPI's aarch64 torch 2.10.0 and TensorFlow 2.21.0 wheels are
    CPU builds, so an arm64 image of either trained on the CPU. The cells are excluded, saying so."""
    m = load(ROOT / "matrix.yaml")
    arm = {c.name: c for c in m.cells if c.platform == "linux/arm64"}
    for name, why in (
        (PT_CELL + "-arm64", r"pytorch 2\.10\.0 has no CUDA build for linux/arm64: .*2\.10\.0\+cpu"),
        (TF_CELL + "-arm64", r"tensorflow 2\.21\.0 has no CUDA build for linux/arm64: .*is_cuda_build False"),
    ):
        assert arm[name].excluded and re.search(why, arm[name].excluded), arm[name]
    kept = [c.name for c in m.included if c.platform == "linux/arm64" and c.framework in ("pytorch", "tensorflow")]
    assert kept and all("pytorch2.14.1" in n or "pytorch2.15.0" in n for n in kept), kept


def test_every_wheel_framework_release_declares_its_code_on_every_platform():
    """A PyTorch or TensorFlow release without gpu_code would leave the catalogue's "built for" to
    the row's list alone, which is what the arm64 CPU wheels once hid behind."""
    m = load(ROOT / "matrix.yaml")
    for name in ("pytorch", "tensorflow"):
        for r in m.spec.frameworks[name].releases:
            assert set(r.gpu_code) == set(m.spec.axes.platform), (name, r.version, r.gpu_code)


def test_a_gpu_code_entry_that_is_not_gpu_code_stops_the_load(tmp_path: Path):
    text = (ROOT / "matrix.yaml").read_text().replace("[sm_60, sm_70,", "[sm60, sm_70,", 1)
    (tmp_path / "matrix.yaml").write_text(text)
    for rel in ("patches",):
        (tmp_path / rel).symlink_to(ROOT / rel)
    with pytest.raises(Exception, match=r"gpu_code\[linux/amd64\]: \['sm60'\] is not GPU code"):
        load(tmp_path / "matrix.yaml")


# ----------------------------------------------------------------------------- the catalogue


def rows_by_name() -> dict[str, catalogue.Row]:
    m = load(ROOT / "matrix.yaml")
    return {r.name: r for r in catalogue.rows(m, ROOT, {"cells": {}})}


def test_the_tensorflow_rows_are_built_for_ampere_ada_and_hopper_not_blackwell():
    row = rows_by_name()[TF_CELL]
    assert [b["architecture"] for b in row.built_for] == ["8.0", "8.6", "8.9", "9.0"]
    assert row.built_for[-1]["code"] == "PTX (tensorflow)"  # TF 2.21 has PTX only for Hopper
    assert set(row.not_built_for) == {"10.0", "12.0"}
    assert all("tensorflow/tensorflow#111958" in why for why in row.not_built_for.values())
    line = next(ln for ln in catalogue.markdown([row]).splitlines() if ln.startswith(f"| `{TF_CELL}`"))
    assert "| 8.0, 8.6, 8.9, 9.0 (PTX: tensorflow); not 10.0, 12.0 (note 1) | no GPU tier recorded |" in line
    assert "1. tensorflow 2.21.0: XLA in TensorFlow 2.21" in catalogue.markdown([row])


def test_the_pytorch_rows_are_built_for_every_gpu_of_their_row_in_machine_code():
    rows = rows_by_name()
    for name in (PT_CELL, "pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12-arm64"):
        row = rows[name]
        assert {b["code"] for b in row.built_for} == {gpu_code.MACHINE_CODE}, row.built_for
        assert [b["architecture"] for b in row.built_for] == row.gpu_architectures and not row.not_built_for


def test_tested_on_is_the_gpus_a_passed_gpu_tier_ran_on_and_nothing_else(tmp_path: Path):
    junit = tmp_path / "junit.xml"

    def run(gpu_outcome: str | None) -> dict:
        cases = '<testcase name="t"><properties><property name="image" value="trainbase/x:r1"/>'
        cases += '<property name="tier" value="static"/></properties></testcase>'
        if gpu_outcome:
            inner = "" if gpu_outcome == "passed" else f"<{gpu_outcome}/>"
            cases += '<testcase name="g"><properties><property name="image" value="trainbase/x:r1"/>'
            cases += f'<property name="tier" value="gpu"/></properties>{inner}</testcase>'
        junit.write_text(
            '<testsuites><testsuite name="s"><properties><property name="host.gpus" '
            f'value="8 x NVIDIA H100 80GB HBM3 (9.0)"/></properties>{cases}</testsuite></testsuites>'
        )
        record: dict = {}
        report = {"cells": [{"name": "x", "status": "built", "size_bytes": 1, "tag": "r1"}]}
        catalogue.record_run(
            record, report, catalogue.tiers_from_junit(junit), "here", "2026-12-03", catalogue.gpus_from_junit(junit)
        )
        return record["cells"]["x"]

    assert run("passed")["tested_on"] == "8 x NVIDIA H100 80GB HBM3 (9.0)"
    assert "tested_on" not in run("failure")  # a GPU tier that failed tested nothing
    assert "tested_on" not in run("skipped")  # nor one skipped for want of a GPU
    assert "tested_on" not in run(None)


def test_the_host_names_its_gpus_by_model_and_compute_capability():
    from trainbase_conformance.host import describe_gpus

    smi = "NVIDIA H100 80GB HBM3, 9.0\n" * 8 + "NVIDIA L40S, 8.9\n"
    assert describe_gpus(smi) == "8 x NVIDIA H100 80GB HBM3 (9.0); 1 x NVIDIA L40S (8.9)"


def test_the_catalogue_twin_carries_built_for_and_tested_on():
    images = {i["name"]: i for i in json.loads((ROOT / "docs/images.json").read_text())["images"]}
    tf = images[TF_CELL]
    assert tf["built_for"][-1] == {"architecture": "9.0", "code": "PTX (tensorflow)"}
    assert "10.0" in tf["not_built_for"] and tf["tested_on"] == ""
    # tested on is the record's GPUs of a passed GPU tier, nothing else: "" wherever none is recorded
    record = json.loads((ROOT / "docs/catalogue-record.json").read_text())["cells"]
    for name, i in images.items():
        assert i["tested_on"] == ((record.get(name) or {}).get("tested_on") or ""), name


# ----------------------------------------------------------------------------- the static check


def answers(torch: dict | None = None, tf: dict | None = None):
    def answer(node, cmd, env):
        if "_cuda_getArchFlags" in cmd:
            return 0, json.dumps(
                {"version": "2.10.0+cu128", "cuda": "12.8", "code": TORCH_2_10_X86.split(), **(torch or {})}
            ) + "\n"
        if "get_build_info" in cmd:
            return 0, json.dumps({"version": "2.21.0", "cuda": "12.5.1", "code": TF_2_21_X86, **(tf or {})}) + "\n"
        raise AssertionError(cmd)

    return answer


def image(declared: dict, answer) -> FakeTarget:
    target = FakeTarget(dict.fromkeys(declared, "v"), answer)
    target.manifest["gpu_code"] = declared
    return target


def test_the_wheels_the_manifest_declares_pass():
    fw.test_framework_wheels_carry_the_declared_gpu_code(image({"pytorch": TORCH_2_10_X86.split()}, answers()))
    fw.test_framework_wheels_carry_the_declared_gpu_code(image({"tensorflow": TF_2_21_X86}, answers()))


def test_a_cpu_build_of_torch_fails_saying_the_image_would_train_on_the_cpu():
    """torch 2.10.0's aarch64 wheel on PyPI, as its version.py says: 2.10.0+cpu, cuda None."""
    cpu = answers(torch={"version": "2.10.0+cpu", "cuda": None, "code": []})
    with pytest.raises(
        AssertionError, match=r"pytorch 2\.10\.0\+cpu is a CPU build \(no CUDA\): the image would train on the CPU"
    ):
        fw.test_framework_wheels_carry_the_declared_gpu_code(image({"pytorch": TORCH_2_10_X86.split()}, cpu))


def test_a_cpu_build_of_tensorflow_fails_too():
    """TensorFlow 2.21.0's aarch64 wheel: build_info has is_cuda_build False and no capabilities."""
    cpu = answers(tf={"cuda": None, "code": []})
    with pytest.raises(AssertionError, match=r"tensorflow 2\.21\.0 is a CPU build"):
        fw.test_framework_wheels_carry_the_declared_gpu_code(image({"tensorflow": TF_2_21_X86}, cpu))


def test_a_wheel_of_other_code_fails_naming_what_it_lacks_and_adds():
    """torch 2.15.0's aarch64 code where the x86_64 wheel's is declared (a wheel of the wrong build)."""
    other = answers(torch={"code": ["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"]})
    with pytest.raises(AssertionError, match=r"lacks \['sm_70', 'sm_75', 'sm_86'\]; it also has \['sm_110'\]"):
        fw.test_framework_wheels_carry_the_declared_gpu_code(image({"pytorch": TORCH_2_10_X86.split()}, other))


def test_a_framework_no_probe_reads_fails_and_an_image_declaring_none_skips():
    with pytest.raises(AssertionError, match=r"declares jax's GPU code and no probe reads it"):
        fw.test_framework_wheels_carry_the_declared_gpu_code(image({"jax": ["sm_90"]}, answers()))
    with pytest.raises(pytest.skip.Exception, match=r"declares no framework wheel's GPU code"):
        fw.test_framework_wheels_carry_the_declared_gpu_code(image({}, answers()))


def test_every_rendered_framework_image_with_a_wheel_declares_its_code():
    for path in sorted((ROOT / "images").glob("*/manifest.json")):
        manifest = json.loads(path.read_text())
        wheels = {"pytorch", "tensorflow"} & set(manifest["frameworks"])
        assert set(manifest.get("gpu_code") or {}) == wheels, path.parent.name
