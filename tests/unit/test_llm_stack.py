"""The LLM stack (issue 66): how matrix.yaml declares TransformerEngine + FlashAttention-4 on the
PyTorch rows and refuses it elsewhere with a reason; the block that builds TE's extension; the
conformance checks made to fail on fake images; the GPU example's comparisons fed with numbers
(the passing ones measured on an H200); tb-doctor's gpu.llm_stack on simulated GPUs."""

from __future__ import annotations

import importlib.util
import json
import math
from types import SimpleNamespace

import pytest

from trainbase.define.matrix import load
from trainbase_conformance.checks import test_llm_stack as llm

from .conftest import ROOT
from .doctor_fakes import FakeNode, result

# measured on an H200 (scripts/gpu-llm-stack-check.sh, cuobjdump --list-elf of TE 2.20.2's cu13 core)
TE_CORE_SASS = {"sm_75", "sm_80", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_103a", "sm_107a", "sm_120"}
ARCHS_13_2 = ["8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0"]


def _example():
    spec = importlib.util.spec_from_file_location("llm_stack_gpu", ROOT / "examples" / "llm_stack_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ex = _example()


# ----------------------------------------------------------------------------- the matrix


@pytest.fixture(scope="module")
def m():
    return load(ROOT / "matrix.yaml")


def test_the_stack_is_a_framework_on_the_cuda13_pytorch_rows(m):
    cells = [c for c in m.included if c.framework == "te"]
    assert cells and {c.cuda for c in cells} == {"13.0", "13.2"}
    assert all(c.parent and c.parent.startswith("pytorch") for c in cells), [c.parent for c in cells]
    assert {c.platform for c in cells} == {"linux/amd64"}
    assert "local" in m.cell("te2.20.2-pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12").profiles
    assert any(c.os == "ubuntu24.04" for c in cells if "production" in c.profiles)


@pytest.mark.parametrize(
    "name, reason",
    [
        (
            "te2.20.2-pytorch2.10.0-openmpi4.1.4-cuda12.8-cudnn9-debian12",
            "te has no release for CUDA 12.8 built on pytorch 2.10.0 (declared: 2.20.2 -> CUDA 13.0, 13.2): "
            "TransformerEngine's PyTorch extension takes the core library of torch's CUDA major",
        ),
        (
            "te2.20.2-pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12-arm64",
            "rule arm64-frameworks-from-wheels: Horovod, DeepSpeed and TransformerEngine's PyTorch extension build from sdists",
        ),
        ("te2.20.2-pytorch2.15.0-openmpi5.0.10-cuda13.2-cudnn9-ubuntu22.04", "rule frameworks-on-current-lts"),
    ],
)
def test_explain_says_why_a_row_cannot_have_the_stack(m, name, reason):
    from trainbase.cli import cells as cellmod

    c = cellmod.find(m, name)  # as `build.py explain NAME` finds it
    assert c is not None and c.excluded and reason in c.excluded, c


def test_the_block_builds_the_extension_from_the_pinned_sdist_and_never_the_guessed_wheel(m):
    spec = m.spec.frameworks["te"].releases[0]
    art = m.spec.artifacts[spec.artifact]
    text = (
        ROOT / "images" / "te2.20.2-pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12" / "Dockerfile"
    ).read_text()
    assert f"tb-fetch {art.url} {art.sha256} " in text
    assert "NVTE_PYTORCH_FORCE_BUILD=TRUE" in text and "--no-build-isolation" in text
    # the compiler's tree is gone after the layer, the versions asserted in it
    assert "python -m pip uninstall -y -q nvidia-cuda-nvcc" in text
    assert "v('transformer_engine_torch') == v('transformer_engine_cu13') == '2.20.2'" in text
    # the pins include the metapackage TE's import requires, and cuRAND, which it loads at import
    assert "transformer-engine==2.20.2" in spec.packages and "curand" in spec.cuda_libraries
    # the DSL's aarch64 link stubs never ship in an amd64 image
    assert 'rm -rf "$site"/nvidia_cutlass_dsl/cu*/lib/stubs/aarch64-*' in text
    manifest = json.loads(
        (
            ROOT / "images" / "te2.20.2-pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12" / "manifest.json"
        ).read_text()
    )
    assert manifest["framework_packages"]["te"]["nvidia-curand"] == "10.4.2.66"
    assert "libcute_dsl_runtime.so" in {d["soname"] for d in manifest["duplicate_libraries"]}


# ----------------------------------------------------------------------------- static checks


def test_sass_for_follows_the_rules_gpus_run_machine_code_by():
    assert llm.sass_for(TE_CORE_SASS, "8.6") == "sm_80"  # A10/A40 run A100's code
    assert llm.sass_for(TE_CORE_SASS, "10.3") == "sm_103a"  # B300: its own arch-specific code
    assert llm.sass_for({"sm_100", "sm_100a"}, "10.3") == "sm_100"  # else the family's 10.0
    assert llm.sass_for({"sm_90a"}, "9.0") == "sm_90a"
    assert llm.sass_for({"sm_100a"}, "10.3") is None  # arch-specific code runs on its GPU only
    assert llm.sass_for({"sm_90"}, "10.0") is None  # never across majors
    assert llm.uncovered(TE_CORE_SASS, ARCHS_13_2) == []


class _Target:
    def __init__(self, manifest: dict, probe: dict | None = None, sh: str = "", rc: int = 0):
        self.manifest, self.probe = manifest, probe
        self.name, self.python = manifest.get("name", "img"), "/opt/venv/bin/python"
        self.container = SimpleNamespace(exec=lambda *a, **k: None, put=lambda *a, **k: None)
        self._sh = SimpleNamespace(stdout=sh, stderr="", rc=rc)

    def json_probe(self, cmd: str, timeout: int = 120) -> dict:
        return self.probe

    def sh(self, cmd: str, timeout: int = 120):
        return self._sh

    def require(self, what):
        pytest.fail(f"requires {what}")


MANIFEST = {
    "name": "te2.20.2-pytorch2.15.0-openmpi5.0.11-cuda13.2-cudnn9-debian12",
    "frameworks": {"pytorch": "2.15.0", "te": "2.20.2"},
    "framework_packages": {"te": {"transformer-engine-cu13": "2.20.2", "flash-attn-4": "4.0.0b36"}},
    "cuda_compiler": {"cuobjdump": "/opt/venv/nvidia/cu13/bin/cuobjdump", "architectures": ARCHS_13_2},
}


def test_the_kernel_check_fails_on_a_core_without_blackwell_workstation_code():
    t = _Target(MANIFEST, {"lib": "/x/libtransformer_engine.so", "rc": 0, "sm": sorted(TE_CORE_SASS - {"sm_120"})})
    with pytest.raises(AssertionError, match="TransformerEngine's core has no code for 12.0"):
        llm.test_te_core_kernels_run_on_every_declared_gpu(t)
    llm.test_te_core_kernels_run_on_every_declared_gpu(
        _Target(MANIFEST, {"lib": "/x", "rc": 0, "sm": sorted(TE_CORE_SASS)})
    )


def test_the_kernel_check_fails_when_cuobjdump_reads_nothing():
    t = _Target(MANIFEST, {"lib": "/x/libtransformer_engine.so", "rc": 255, "sm": [], "err": "not an ELF"})
    with pytest.raises(AssertionError, match="cuobjdump read no machine code"):
        llm.test_te_core_kernels_run_on_every_declared_gpu(t)


def _versions(core="2.20.2", meta="2.20.2", ext="2.20.2", fa4="4.0.0b36", cores=None):
    return {
        "transformer_engine": meta,
        "transformer_engine_torch": ext,
        "flash_attn_4": fa4,
        "core": cores if cores is not None else {"transformer_engine_cu13": core},
    }


@pytest.mark.parametrize(
    "probe, message",
    [
        (_versions(ext="2.19.0"), "the PyTorch extension is 2.19.0, the release is 2.20.2"),
        (_versions(core="2.19.0"), "the core is {'transformer_engine_cu13': '2.19.0'}"),
        (
            _versions(cores={"transformer_engine_cu13": "2.20.2", "transformer_engine_cu12": "2.20.2"}),
            "want one TransformerEngine core wheel",
        ),
        (_versions(meta=None), "transformer-engine None, want 2.20.2"),
        (_versions(fa4="4.0.0b30"), "flash-attn-4 4.0.0b30, matrix.yaml pins 4.0.0b36"),
    ],
)
def test_the_version_check_fails_on_each_mismatch(probe, message):
    with pytest.raises(AssertionError, match=message.replace("(", r"\(").replace("{", r"\{").replace("[", r"\[")):
        llm.test_te_and_fa4_are_the_releases_versions(_Target(MANIFEST, probe))
    llm.test_te_and_fa4_are_the_releases_versions(_Target(MANIFEST, _versions()))


SITE = "/opt/venv/lib/python3.11/site-packages"
ONE = {
    "libcudnn.so.9": [f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9.26.0"],
    "libnccl.so.2": [f"{SITE}/nvidia/nccl/lib/libnccl.so.2.30.7"],
    "libcublas.so": [f"{SITE}/nvidia/cu13/lib/libcublas.so.13.4.1.3"],
    "libcublasLt.so": [f"{SITE}/nvidia/cu13/lib/libcublasLt.so.13.4.1.3"],
    "libtorch_cuda.so": [f"{SITE}/torch/lib/libtorch_cuda.so"],
    "libc10.so": [f"{SITE}/torch/lib/libc10.so"],
}
MAPS = [p[0] for p in ONE.values()] + [
    f"{SITE}/transformer_engine/wheel_lib/libtransformer_engine.so",
    f"{SITE}/transformer_engine_torch.cpython-311-x86_64-linux-gnu.so",
]


def test_the_linkage_check_fails_on_a_second_cudnn_a_wheel_brought():
    second = dict(ONE, **{"libcudnn.so.9": ONE["libcudnn.so.9"] + [f"{SITE}/nvidia_cutlass_dsl/lib/libcudnn.so.9.1.0"]})
    t = _Target(MANIFEST, {"maps": MAPS, "found": second, "te": MAPS[-2:]})
    with pytest.raises(AssertionError, match="libcudnn.so.9 is in the image 2 times"):
        llm.test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch(t)
    mapped_twice = MAPS + [f"{SITE}/other/libnccl.so.2.21.5"]
    with pytest.raises(AssertionError, match="libnccl.so.2 mapped from 2 files"):
        llm.test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch(
            _Target(MANIFEST, {"maps": mapped_twice, "found": ONE, "te": MAPS[-2:]})
        )
    with pytest.raises(AssertionError, match="the TE core library was not loaded"):
        llm.test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch(
            _Target(MANIFEST, {"maps": MAPS, "found": ONE, "te": MAPS[-1:]})
        )
    with pytest.raises(AssertionError, match="the extension was not loaded"):
        llm.test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch(
            _Target(MANIFEST, {"maps": MAPS, "found": ONE, "te": MAPS[-2:-1]})
        )
    llm.test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch(
        _Target(MANIFEST, {"maps": MAPS, "found": ONE, "te": MAPS[-2:]})
    )


def test_every_check_skips_an_image_without_the_stack():
    plain = dict(MANIFEST, frameworks={"pytorch": "2.15.0"})
    for check in (
        llm.test_te_and_fa4_are_the_releases_versions,
        llm.test_te_core_kernels_run_on_every_declared_gpu,
        llm.test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch,
        llm.test_te_and_fa4_import_without_a_gpu,
        llm.test_fp8_transformer_engine_and_flash_attention_4_on_the_gpu,
    ):
        with pytest.raises(pytest.skip.Exception, match="has no te"):
            check(_Target(plain, {}))


# ----------------------------------------------------------------------------- the GPU tier

H200_FA4 = {
    "out": 0.010282278060913086,
    "dq": 0.013695478439331055,
    "dk": 0.013778924942016602,
    "dv": 0.016881465911865234,
}
H200_MATH = {
    "out": 0.0077822208404541016,
    "dq": 0.007807254791259766,
    "dk": 0.007742166519165039,
    "dv": 0.0152130126953125,
}
H200_FP8 = {"forward": 0.037604160606861115, "dgrad": 0.058850374072790146, "wgrad": 0.05889672785997391}


def test_the_fp8_comparison_passes_what_an_h200_measured_and_fails_bf16_or_wrong_numbers():
    assert ex.fp8_verdict(H200_FP8)["ok"]
    assert ex.fp8_verdict(dict(H200_FP8, forward=0.0))["problems"] == [
        "forward equals bf16 to 0.00e+00: FP8 did not run"
    ]
    assert not ex.fp8_verdict(dict(H200_FP8, forward=0.2))["ok"]
    assert ex.fp8_verdict(dict(H200_FP8, wgrad=0.3))["problems"] == ["wgrad error 0.3000 > 0.15"]


def test_the_fa4_comparison_passes_what_an_h200_measured_and_fails_a_wrong_or_nan_kernel():
    assert ex.fa4_verdict(H200_FA4, H200_MATH)["ok"]
    # FA4 without the causal mask (measured on the H200: 3.55 against 0.0078)
    bad = ex.fa4_verdict(dict(H200_FA4, out=3.55, dq=4.04), H200_MATH)
    assert not bad["ok"] and bad["problems"][0].startswith("out: FA4 error 3.55e+00 > 2.0 x torch's 7.78e-03")
    assert not ex.fa4_verdict(dict(H200_FA4, dv=math.nan), H200_MATH)["ok"]


def test_what_a_gpu_can_run_and_the_doctor_agree():
    for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0)):
        caps = ex.capabilities(cc)
        from .doctor_fakes import import_doctor

        import_doctor()
        from trainbase_doctor.checks_stack import llm_capabilities

        assert {k: llm_capabilities(cc)[k] for k in caps} == caps, cc
    assert ex.capabilities((8, 9)) == {"fp8": True, "fa4": False}
    assert ex.capabilities((9, 0)) == {"fp8": True, "fa4": True}
    assert ex.capabilities((12, 0)) == {"fp8": True, "fa4": False}


def _gpu_output(checks, skipped=None, device="NVIDIA H200", cc="9.0"):
    doc = {"device": device, "cc": cc, "torch": "2.15.0", "checks": checks, "skipped": skipped or {}}
    return "\n".join(("OK " if c["ok"] else "FAIL ") + f"check={c['check']}" for c in checks) + "\n" + json.dumps(doc)


def test_the_gpu_check_fails_on_an_fp8_layer_that_ran_in_bf16():
    checks = [
        {"check": "te.fp8_linear", **ex.fp8_verdict(dict(H200_FP8, forward=0.0))},
        {"check": "te.transformer_layer", "ok": True},
        {"check": "fa4.attention", **ex.fa4_verdict(H200_FA4, H200_MATH)},
    ]
    t = _Target(MANIFEST, sh=_gpu_output(checks), rc=1)
    with pytest.raises(AssertionError, match="FP8 did not run"):
        llm.test_fp8_transformer_engine_and_flash_attention_4_on_the_gpu(t)


def test_the_gpu_check_fails_when_the_example_cannot_run_and_passes_with_skips_by_reason():
    t = _Target(MANIFEST, sh="Traceback ... ImportError: libtransformer_engine.so", rc=1)
    with pytest.raises(AssertionError, match="llm_stack_gpu.py exited 1"):
        llm.test_fp8_transformer_engine_and_flash_attention_4_on_the_gpu(t)
    a100 = _gpu_output(
        [{"check": "te.transformer_layer", "fp8": False, "ok": True}],
        {
            "te.fp8_linear": "FP8 needs sm_89+; this GPU is sm_80",
            "fa4.attention": "FlashAttention-4 has kernels for sm_90 and sm_100 only; this GPU is sm_80",
        },
        device="NVIDIA A100",
        cc="8.0",
    )
    llm.test_fp8_transformer_engine_and_flash_attention_4_on_the_gpu(_Target(MANIFEST, sh=a100))


# ----------------------------------------------------------------------------- tb-doctor gpu.llm_stack

TE_IMAGE = {"name": MANIFEST["name"], "schema": 1, "frameworks": MANIFEST["frameworks"], "components": {}}


def _node(tmp_path, devices, manifest=TE_IMAGE, expect=()):
    n = FakeNode(tmp_path, manifest=manifest, expect=expect)
    n.cache["cuda"] = {"count": len(devices), "devices": devices} if devices else {"error": "no-driver"}
    return n


def test_the_doctor_says_an_h200_runs_fp8_and_fa4(tmp_path):
    r = result(_node(tmp_path, ["NVIDIA H200 (cc 9.0)"]), "gpu.llm_stack")
    assert (
        r.status == "ok"
        and r.summary == "FP8 (TransformerEngine) and FlashAttention-4 on every GPU: NVIDIA H200 (cc 9.0)"
    )
    assert r.facts["fp8"] and r.facts["fa4"] and not r.facts["mxfp8"]


def test_the_doctor_warns_on_an_a100_and_an_l40s_with_what_to_do(tmp_path):
    r = result(_node(tmp_path, ["NVIDIA A100-SXM4-80GB (cc 8.0)"]), "gpu.llm_stack")
    assert r.status == "warn" and r.summary == "NVIDIA A100-SXM4-80GB (cc 8.0): no FP8 or FlashAttention-4"
    assert "train in bf16" in r.hint
    r = result(_node(tmp_path / "l40s", ["NVIDIA L40S (cc 8.9)"]), "gpu.llm_stack")
    assert r.status == "warn" and r.summary == "NVIDIA L40S (cc 8.9): no FlashAttention-4" and r.facts["fp8"]


def test_the_doctor_skips_without_a_gpu_or_without_the_stack(tmp_path):
    assert result(_node(tmp_path, []), "gpu.llm_stack").status == "skip"
    assert result(_node(tmp_path / "x", [], expect=("gpu",)), "gpu.llm_stack").status == "fail"
    # --expect gpu without a GPU fails every gpu check, on an image without the stack too
    no_te = dict(TE_IMAGE, frameworks={"pytorch": "2.15.0"})
    assert result(_node(tmp_path / "y", [], manifest=no_te, expect=("gpu",)), "gpu.llm_stack").status == "fail"
    plain = dict(TE_IMAGE, frameworks={"pytorch": "2.15.0"})
    r = result(_node(tmp_path / "p", ["NVIDIA H200 (cc 9.0)"], manifest=plain), "gpu.llm_stack")
    assert r.status == "skip" and "no TransformerEngine" in r.summary


# ----------------------------------------------------------------------------- lockstep


def test_an_extension_sdist_of_another_version_than_the_release_is_refused(repo_copy):
    from trainbase.errors import MatrixError

    f = repo_copy / "matrix.yaml"
    f.write_text(
        f.read_text().replace("transformer_engine_torch-2.20.2.tar.gz", "transformer_engine_torch-2.19.0.tar.gz")
    )
    with pytest.raises(
        MatrixError, match=r"transformer_engine_torch-2.19.0.tar.gz \(version 2.19.0\), but the release is 2.20.2"
    ):
        load(f)


def test_bump_holds_the_core_with_its_extension_and_the_extensions_floors_hold(m):
    held = [h for h in m.spec.holds if h.where == "frameworks.te.releases[version=2.20.2]"]
    assert held and set(held[0].package) == {"transformer-engine", "transformer-engine-cu13"}
    # the sdist's own install requirements (its PKG-INFO): torch>=2.1, nvidia-cudnn-frontend>=1.29.0
    from packaging.version import Version

    for c in (c for c in m.included if c.framework == "te"):
        torch = c.parent.split("pytorch", 1)[1].split("-", 1)[0]
        assert Version(torch) >= Version("2.1"), c.name
    pins = dict(p.split("==") for p in m.spec.frameworks["te"].releases[0].packages)
    assert Version(pins["nvidia-cudnn-frontend"]) >= Version("1.29.0")


def test_the_gpu_check_fails_when_no_training_step_ran():
    """Every check skipped (a GPU the example wrongly thought too old for all of them): nothing
    was shown working, so the check fails instead of passing on an empty list."""
    none_ran = _gpu_output([], {"te.fp8_linear": "FP8 needs sm_89+; this GPU is sm_90"})
    with pytest.raises(AssertionError, match="te.transformer_layer"):
        llm.test_fp8_transformer_engine_and_flash_attention_4_on_the_gpu(_Target(MANIFEST, sh=none_ran))
