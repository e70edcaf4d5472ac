"""The LLM training stack of a `te` image (issue 66): TransformerEngine (its core library from
NVIDIA's wheel, its PyTorch extension compiled in the image) and FlashAttention-4.

static: the versions are the release's; the core's kernels run on every GPU the CUDA row
declares; TE loads the image's one cuDNN, NCCL, cuBLAS and torch. cpu: the import paths that need
no GPU. gpu: examples/llm_stack_gpu.py -- an FP8 `te.Linear` forward and backward against bf16, a
`TransformerLayer` training step, FlashAttention-4 forward and backward against torch's attention,
each within the tolerance the example states -- skipped per check, with the reason, on a GPU
that cannot run it (FP8 below sm_89, FA4 outside sm_90/sm_100)."""

from __future__ import annotations

import json
import re

import pytest

from .test_frameworks import EX, need, pinned, put_examples, py_json

# what `import transformer_engine.pytorch` maps, by the library's own name: each must be the
# image's single copy (the NVIDIA wheels' tree, torch's lib directory)
SHARED = ("libcudnn.so.9", "libnccl.so.2", "libcublas.so", "libcublasLt.so", "libtorch_cuda.so", "libc10.so")


def sass_for(sms: set[str], arch: str) -> str | None:
    """The machine code among ``sms`` (cuobjdump's sm_XY names) that a GPU of compute capability
    ``arch`` runs: plain sm_XY runs on its own major at its minor or above, sm_XYf (family) the
    same, sm_XYa (architecture-specific) on exactly that GPU. The best (newest) match, or None."""
    major, minor = (int(x) for x in arch.split("."))
    best: tuple[int, str] | None = None
    for s in sms:
        m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", s)
        if not m:
            continue
        smaj, smin, kind = int(m.group(1)), int(m.group(2)), m.group(3)
        runs = (smaj, smin) == (major, minor) if kind == "a" else smaj == major and smin <= minor
        if runs and (best is None or smin > best[0]):
            best = (smin, s)
    return best[1] if best else None


def uncovered(sms: set[str], architectures: list[str]) -> list[str]:
    """The declared architectures no machine code in ``sms`` runs on (no PTX in TE's core: a GPU
    without its code fails at the first kernel, "no kernel image is available")."""
    return [a for a in architectures if sass_for(sms, a) is None]


def single_copies(mapped: list[str], found: dict[str, list[str]]) -> list[str]:
    """Problems: a library of SHARED mapped from more than one file, or found more than once on
    disk. ``mapped``: the paths /proc/self/maps shows; ``found``: soname -> files on disk."""
    problems = []
    for lib in SHARED:
        paths = sorted({p for p in mapped if p.rsplit("/", 1)[-1].startswith(lib)})
        if len(paths) > 1:
            problems.append(f"{lib} mapped from {len(paths)} files: {paths}")
        if len(found.get(lib, [])) > 1:
            problems.append(f"{lib} is in the image {len(found[lib])} times: {found[lib]}")
    return problems


@pytest.mark.static
@pytest.mark.evidence("content")
@pytest.mark.trainbase_contract("the manifest's frameworks.te and framework_packages")
def test_te_and_fa4_are_the_releases_versions(target):
    """The core wheel, the metapackage and the extension built from the sdist are all the
    release's TransformerEngine version (a core of one version under an extension of another
    fails at import with an ABI error, or worse, later); FlashAttention-4 is the pinned one."""
    version = need(target, "te")
    pins = pinned(target, "te")
    info = py_json(
        target,
        """
        import importlib.metadata as md, re
        out = {}
        for d in ("transformer_engine", "transformer_engine_torch", "flash_attn_4"):
            try:
                out[d] = md.version(d)
            except md.PackageNotFoundError:
                out[d] = None
        # every core wheel installed (transformer-engine-cu12, -cu13), by its metadata's name
        out["core"] = {re.sub(r"[-_.]+", "_", d.metadata["Name"]).lower(): d.version for d in md.distributions()
                       if re.fullmatch(r"transformer[-_.]engine[-_.]cu\\d+", d.metadata["Name"] or "", re.I)}
        print(json.dumps(out))
    """,
    )
    core = info["core"]
    assert len(core) == 1, f"want one TransformerEngine core wheel, found {core or 'none'}"
    assert set(core.values()) == {version}, f"the core is {core}, the release is {version}"
    assert info["transformer_engine"] == version, f"transformer-engine {info['transformer_engine']}, want {version}"
    assert info["transformer_engine_torch"] == version, (
        f"the PyTorch extension is {info['transformer_engine_torch']}, the release is {version}"
    )
    assert info["flash_attn_4"] == pins.get("flash-attn-4"), (
        f"flash-attn-4 {info['flash_attn_4']}, matrix.yaml pins {pins.get('flash-attn-4')}"
    )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_te_core_kernels_run_on_every_declared_gpu(target):
    """NVIDIA compiled TransformerEngine's kernels (the core wheel), not this build: read with
    cuobjdump, its machine code must run on every architecture the CUDA row declares (sm_86 runs
    sm_80's code, B300 sm_100's). TE's core ships no PTX, so a missing generation is a GPU on which
    every TE kernel fails."""
    need(target, "te")
    comp = target.manifest.get("cuda_compiler") or {}
    if not comp.get("cuobjdump"):
        pytest.fail("the manifest names no cuobjdump (the te release compiles, so the image keeps one)")
    info = py_json(
        target,
        f"""
        import os, re, subprocess, importlib.util
        root = os.path.dirname(importlib.util.find_spec("transformer_engine").origin)
        lib = os.path.join(root, "wheel_lib", "libtransformer_engine.so")
        elf = subprocess.run([{comp["cuobjdump"]!r}, "--list-elf", lib], capture_output=True, text=True)
        print(json.dumps({{"lib": lib, "rc": elf.returncode, "sm": sorted(set(re.findall(r"sm_\\d+[af]?", elf.stdout))),
                          "err": elf.stderr[-400:]}}))
    """,
        timeout=300,
    )
    assert info["rc"] == 0 and info["sm"], f"cuobjdump read no machine code from {info['lib']}: {info['err']}"
    missing = uncovered(set(info["sm"]), comp["architectures"])
    assert not missing, (
        f"TransformerEngine's core has no code for {', '.join(missing)} (it has {', '.join(info['sm'])}): "
        f"every TE kernel fails there"
    )
    print(
        "TE core: "
        + ", ".join(f"{a} runs {sass_for(set(info['sm']), a)}" for a in comp["architectures"])
        + f" (it carries {', '.join(info['sm'])})"
    )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_te_loads_the_images_one_cudnn_nccl_cublas_and_torch(target):
    """`import transformer_engine.pytorch` maps its core and extension with the image's single
    cuDNN, NCCL, cuBLAS and torch: a wheel that brought a second cuDNN (or a core linked against
    another NCCL) is found here, by what the process really maps and what is on disk."""
    need(target, "te")
    info = py_json(
        target,
        f"""
        import subprocess
        import transformer_engine.pytorch, torch
        torch.cuda.nccl.version()
        maps = sorted({{l.split()[-1] for l in open("/proc/self/maps") if ".so" in l}})
        found = {{}}
        for lib in {list(SHARED)!r}:
            out = subprocess.run(["find", "/", "-xdev", "-name", lib + "*", "-type", "f"], capture_output=True, text=True)
            names = [(p, p.rsplit("/", 1)[-1]) for p in out.stdout.split()]
            found[lib] = sorted(p for p, n in names if n == lib or n.startswith(lib + "."))
        te = [m for m in maps if "transformer_engine" in m]
        print(json.dumps({{"maps": maps, "found": found, "te": te}}))
    """,
        timeout=300,
    )
    assert any(m.endswith("libtransformer_engine.so") for m in info["te"]), (
        f"the TE core library was not loaded: {info['te']}"
    )
    assert any("transformer_engine_torch" in m for m in info["te"]), f"the extension was not loaded: {info['te']}"
    problems = single_copies(info["maps"], info["found"])
    assert not problems, "; ".join(problems)
    for lib in SHARED:
        print(f"{lib}: {[p for p in info['maps'] if p.rsplit('/', 1)[-1].startswith(lib)]}")


@pytest.mark.cpu
@pytest.mark.evidence("load")
def test_te_and_fa4_import_without_a_gpu(target):
    """The paths a CPU-only step needs (a data loader worker, a checkpoint conversion, a config
    check before the job) import without a GPU: TransformerEngine's PyTorch modules and recipes,
    FlashAttention-4's interface and the CuTe DSL. Building an FP8 layer needs a GPU: that is the
    gpu tier's."""
    need(target, "te")
    info = py_json(
        target,
        """
        import transformer_engine, transformer_engine.pytorch as te
        from transformer_engine.common import recipe
        from flash_attn.cute import flash_attn_func
        import cutlass
        r = recipe.DelayedScaling()
        print(json.dumps({"te": transformer_engine.__version__, "linear": hasattr(te, "Linear"),
                          "layer": hasattr(te, "TransformerLayer"), "recipe": type(r).__name__,
                          "fa4": callable(flash_attn_func), "cutlass": cutlass.__name__}))
    """,
        timeout=300,
    )
    assert info["linear"] and info["layer"] and info["fa4"], info
    print(f"imported without a GPU: {info}")


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_fp8_transformer_engine_and_flash_attention_4_on_the_gpu(target):
    """examples/llm_stack_gpu.py in the image: FP8 te.Linear forward and backward within the
    stated tolerance of bf16 (and not equal to it: FP8 must really run), a TransformerLayer step
    (FP8 where the GPU has it) whose loss moves, FA4 forward and backward within 2x / 3x of
    torch's bf16 error against fp32. What this GPU cannot run is listed as skipped, by reason."""
    need(target, "te")
    put_examples(target.container)
    r = target.sh(f"{target.python} -W ignore {EX}/llm_stack_gpu.py", timeout=900)
    lines = r.stdout.strip().splitlines()
    doc = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    assert doc.get("checks") is not None, f"llm_stack_gpu.py exited {r.rc}: {(r.stderr or r.stdout)[-2000:]}"
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert not failed and r.rc == 0, f"on {doc.get('device')} (cc {doc.get('cc')}): {json.dumps(failed)[:3000]}"
    ran = [c["check"] for c in doc["checks"]]
    assert "te.transformer_layer" in ran, doc
    print(f"{doc['device']} (cc {doc['cc']}): ran {', '.join(ran)}; skipped {doc['skipped'] or 'none'}")
    for c in doc["checks"]:
        print(json.dumps(c))
