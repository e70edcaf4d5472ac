"""The frameworks' GPU paths. Proven without a GPU (static, cpu): what a framework loads or runs
the moment a job puts a tensor on a GPU must already be in the image and resolve -- TensorFlow's
CUDA libraries, Horovod's NCCL operations, DeepSpeed's prebuilt ops and the architectures every
compiled CUDA object carries, nvcc and the torch extension toolchain where the image keeps them --
otherwise the job fails (or, worse, silently falls back to the CPU) on the GPU node, not here.
Then run on one (gpu): Horovod's collectives of CUDA tensors, DeepSpeed's fused optimizers."""

from __future__ import annotations

import json

import pytest

from trainbase_conformance.checks.test_frameworks import need, py_json
from trainbase_conformance.fixtures import PROBE_DIR


@pytest.mark.static
@pytest.mark.evidence("load")
def test_tensorflow_gpu_libraries_resolve(target):
    """Every CUDA library TensorFlow's GPU devices load -- the NVIDIA packages its own
    `and-cuda` extra names -- is installed and each of its shared libraries loads by soname
    (as TF dlopens them). TF without, e.g., cuFFT registers no GPU and runs on the CPU with
    nothing but a log line."""
    need(target, "tensorflow")
    info = py_json(
        target,
        """
        import ctypes, importlib.metadata as md, os, re
        from packaging.requirements import Requirement
        wanted = [Requirement(r) for r in md.requires("tensorflow") or []
                  if "extra" in r and re.search(r'extra\\s*==\\s*"and-cuda"', r)]
        out = {"wanted": [w.name for w in wanted], "missing": [], "unloadable": {}, "old": {}, "loaded": []}
        for w in wanted:
            try:
                dist = md.distribution(w.name)
            except md.PackageNotFoundError:
                out["missing"].append(str(w.name))
                continue
            if dist.version not in w.specifier:
                out["old"][w.name] = f"{dist.version} (TF asks {w.specifier})"
            for f in dist.files or []:
                name = os.path.basename(str(f))
                if re.fullmatch(r"lib[\\w+-]+\\.so\\.\\d+", name):
                    try:
                        ctypes.CDLL(name)          # by soname, through the linker's cache
                        out["loaded"].append(name)
                    except OSError as e:
                        out["unloadable"][name] = str(e)[:200]
        print(json.dumps(out))
    """,
    )
    assert info["wanted"], "tensorflow's metadata names no and-cuda extra: cannot tell what its GPU devices load"
    assert not info["missing"], (
        f"TensorFlow's GPU devices need {', '.join(info['missing'])}, not installed: TF would "
        f"skip registering the GPUs and run on the CPU"
    )
    assert not info["unloadable"], f"CUDA libraries TensorFlow loads do not resolve by soname: {info['unloadable']}"
    # an older patch release than TF's floor (the NCCL the image shares with PyTorch) is said, not failed:
    # the soname -- the ABI -- is what loading proves
    print(
        f"{len(info['loaded'])} CUDA libraries load: {', '.join(sorted(info['loaded']))}"
        + (f"; below TF's floor: {info['old']}" if info["old"] else "")
    )


# ----------------------------------------------------------------------- compiled CUDA code


def compiler(target) -> dict:
    """The manifest's CUDA compiler entry (nvcc, the target architectures), where a framework
    of the image compiles CUDA code; skips where none does."""
    c = target.manifest.get("cuda_compiler")
    if not c:
        pytest.skip(f"n/a: no framework of {target.name} compiles CUDA code")
    return c


def sm(arch: str) -> str:
    return "sm_" + arch.replace(".", "")


@pytest.mark.static
@pytest.mark.evidence("load")
def test_horovod_built_with_nccl_gpu_operations(target):
    """Horovod's GPU path is compiled in: the extension reports CUDA and NCCL (the version of the
    image's NCCL, linked shared), so `hvd.allreduce` of a CUDA tensor goes through NCCL. Built
    without them, Horovod loads, passes every CPU check, and the first gradient all-reduce of a
    GPU job throws "Requested ReadyEvent with GPU device but not compiled with CUDA"."""
    need(target, "horovod")
    info = py_json(
        target,
        """
        import glob, os, subprocess
        import horovod, horovod.torch as hvd
        lib = glob.glob(os.path.join(os.path.dirname(horovod.__file__), "torch", "mpi_lib*.so"))
        ldd = subprocess.run(["ldd", lib[0]], capture_output=True, text=True).stdout if lib else ""
        nccl = [ln.split("=>")[1].split("(")[0].strip() for ln in ldd.splitlines() if "libnccl.so" in ln and "=>" in ln]
        print(json.dumps({"cuda": bool(hvd.cuda_built()), "nccl": int(hvd.nccl_built() or 0),
                          "lib": lib[0] if lib else None, "nccl_linked": nccl}))
    """,
    )
    assert info["cuda"] and info["nccl"], (
        f"Horovod was built without GPU operations (cuda_built={info['cuda']}, "
        f"nccl_built={info['nccl']}): an all-reduce of a CUDA tensor fails"
    )
    major, minor, patch = (int(x) for x in target.components["nccl"]["version"].split(".")[:3])
    want = major * 10000 + minor * 100 + patch
    assert info["nccl"] == want, f"Horovod was built against NCCL {info['nccl']}, the image's is {want}"
    assert info["nccl_linked"] and "not found" not in info["nccl_linked"][0], (
        f"Horovod's extension does not link the image's NCCL as a shared library: {info}"
    )


def torch_arch_list(architectures: list[str]) -> str:
    """TORCH_CUDA_ARCH_LIST for the declared GPUs: each one's code, PTX for the newest."""
    return " ".join(architectures[:-1] + [architectures[-1] + "+PTX"])


def arch_list_env_problem(env_value: str | None, comp: dict | None) -> str | None:
    """Why the image's TORCH_CUDA_ARCH_LIST is wrong, or None. Every CUDA extension a user builds
    in the image later (DeepSpeed's JIT ops, torch.utils.cpp_extension) compiles for this list,
    so where nvcc is kept it must be exactly the manifest's GPUs; where no nvcc is kept the image
    compiles nothing and must not carry a list nobody checks."""
    if comp is None or not comp.get("kept"):
        if env_value is not None:
            return f"TORCH_CUDA_ARCH_LIST={env_value!r} is set, but the image keeps no CUDA compiler (the manifest's cuda_compiler)"
        return None
    want = torch_arch_list(comp["architectures"])
    if env_value != want:
        return f"TORCH_CUDA_ARCH_LIST is {env_value!r}, the manifest's GPUs are {want!r}"
    return None


@pytest.mark.static
@pytest.mark.evidence("content")
def test_torch_cuda_arch_list_is_the_declared_gpus(target):
    """The TORCH_CUDA_ARCH_LIST baked into the image (what every later extension build inherits)
    names exactly the manifest's architectures, PTX for the newest -- or is absent where the
    image keeps no nvcc."""
    r = target.sh("printenv TORCH_CUDA_ARCH_LIST || true", timeout=60)
    value = r.stdout.strip() or None
    problem = arch_list_env_problem(value, target.manifest.get("cuda_compiler"))
    assert problem is None, problem


def runtime_tool_problems(declared: list[str], results: dict[str, dict]) -> list[str]:
    """One line per declared run-time tool that is missing, broken or was not tried."""
    problems = []
    for tool in declared:
        r = results.get(tool)
        if r is None:
            problems.append(f"{tool}: not tried")
        elif not r.get("ok"):
            problems.append(f"{tool}: {r.get('detail')}")
    return problems


@pytest.mark.static
@pytest.mark.evidence("run")
def test_runtime_tools_run(target):
    """Every tool a framework of the image executes on a GPU node (the manifest's runtime_tools:
    Triton's ptxas for TorchInductor, the nvcc wheel's ptxas for TensorFlow's XLA, nvcc and ninja
    for DeepSpeed's JIT ops) is found where its caller looks, answers its version and does a
    trivial piece of its job without a GPU (probes/runtime_tools.py). Loading libraries cannot
    show a missing ptxas: the job's first compiled kernel does."""
    tools = target.manifest.get("runtime_tools") or []
    if not tools:
        pytest.skip(f"n/a: no framework of {target.name} executes a compiler or assembler at run time")
    results = target.json_probe(f"{target.python} {PROBE_DIR}/runtime_tools.py {' '.join(tools)}", timeout=600)
    problems = runtime_tool_problems(tools, results)
    assert not problems, "run-time tools the frameworks execute do not work: " + "; ".join(problems)
    for tool in tools:
        print(f"{tool}: {results[tool]['path']}: {results[tool].get('version', '')}: {results[tool]['detail']}")


@pytest.mark.static
@pytest.mark.evidence("load")
def test_compiled_cuda_code_targets_every_declared_gpu(target):
    """Every CUDA object a framework of the image compiled (Horovod's extension, DeepSpeed's
    prebuilt ops) carries machine code for each GPU generation the CUDA row declares, and PTX
    for the newest (so newer GPUs JIT it): read from the binaries with cuobjdump. Code built
    for the build machine's GPU alone -- or for none -- fails on the GPUs users run."""
    comp = compiler(target)
    fws = target.manifest.get("frameworks") or {}
    if not any(f in fws for f in ("horovod", "deepspeed")):
        # TransformerEngine's extension is host C++: nvcc's tree gives it headers; its kernels
        # come compiled in NVIDIA's core wheel (test_llm_stack.py reads them)
        pytest.skip(f"n/a: no framework of {target.name} compiles device code in the image ({', '.join(fws)})")
    want = [sm(a) for a in comp["architectures"]]
    info = py_json(
        target,
        f"""
        import glob, importlib.util, os, re, subprocess
        roots = [os.path.dirname(importlib.util.find_spec(p).origin) for p in ("horovod", "deepspeed")
                 if importlib.util.find_spec(p)]
        found = {{}}
        for root in roots:
            for so in glob.glob(os.path.join(root, "**", "*.so"), recursive=True):
                elf = subprocess.run([{comp["cuobjdump"]!r}, "--list-elf", so], capture_output=True, text=True)
                ptx = subprocess.run([{comp["cuobjdump"]!r}, "--list-ptx", so], capture_output=True, text=True)
                sms = sorted(set(re.findall(r"sm_\\d+a?", elf.stdout)))
                ptxs = sorted(set(re.findall(r"sm_\\d+", ptx.stdout)))
                if sms or ptxs:
                    found[os.path.relpath(so, os.path.dirname(root))] = {{"sm": sms, "ptx": ptxs}}
        print(json.dumps(found))
    """,
        timeout=300,
    )
    assert info, (
        f"no CUDA code found in the image's compiled framework objects (cuobjdump {comp['cuobjdump']}): "
        f"they were built without nvcc, or for no GPU"
    )
    bad = {}
    for so, v in info.items():
        problems = [f"lacks {', '.join(sorted(set(want) - set(v['sm'])))}"] if set(want) - set(v["sm"]) else []
        problems += [f"no PTX for {want[-1]} (has {', '.join(v['ptx']) or 'none'})"] if want[-1] not in v["ptx"] else []
        if problems:
            bad[so] = "; ".join(problems)
    assert not bad, f"CUDA objects not built for every declared GPU ({', '.join(want)} + PTX {want[-1]}): {bad}"
    print(f"{len(info)} CUDA objects, each with {', '.join(want)} and PTX {want[-1]}: {', '.join(sorted(info))}")


@pytest.mark.static
@pytest.mark.evidence("load")
def test_deepspeed_prebuilt_ops_load_without_a_compiler_run(target):
    """Each op the manifest says DeepSpeed prebuilt is in DeepSpeed's installed-ops table and its
    compiled module imports (with the CUDA accelerator a GPU node selects), without a JIT build:
    otherwise a job's first step compiles with nvcc, or stops where there is none."""
    need(target, "deepspeed")
    ops = (target.manifest.get("prebuilt_ops") or {}).get("deepspeed") or []
    if not ops:
        pytest.skip("n/a: the manifest names no prebuilt DeepSpeed ops")
    info = py_json(
        target,
        f"""
        import importlib, os, time
        os.environ["DS_ACCELERATOR"] = "cuda"
        from deepspeed.git_version_info import installed_ops
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
        out = {{}}
        for op in {ops!r}:
            t = time.monotonic()
            try:
                m = importlib.import_module(ALL_OPS[op].absolute_name())
                out[op] = {{"installed": bool(installed_ops.get(op)), "file": m.__file__, "s": time.monotonic() - t}}
            except Exception as e:
                out[op] = {{"installed": bool(installed_ops.get(op)), "error": f"{{type(e).__name__}}: {{e}}"[:300]}}
        print(json.dumps(out))
    """,
        timeout=300,
    )
    bad = {op: v for op, v in info.items() if not v["installed"] or "error" in v or not v["file"].endswith(".so")}
    assert not bad, f"DeepSpeed ops the image claims prebuilt that are not: {bad}"
    slow = {op: round(v["s"]) for op, v in info.items() if v["s"] > 10}
    assert not slow, f"importing these ops took seconds (a JIT build?): {slow}"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_deepspeed_cpu_adam_steps_match_torch_adamw(target):
    """DeepSpeed's prebuilt CPU Adam (ZeRO-Offload's optimizer) runs and agrees with
    torch.optim.AdamW step for step -- a prebuilt op that loads but computes wrong would pass
    every load check."""
    need(target, "deepspeed")
    if "cpu_adam" not in ((target.manifest.get("prebuilt_ops") or {}).get("deepspeed") or []):
        pytest.skip("n/a: cpu_adam is not prebuilt in this image")
    info = py_json(
        target,
        """
        import torch
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        torch.manual_seed(0)
        ref = [torch.randn(256, 128, requires_grad=True), torch.randn(1000, requires_grad=True)]
        mine = [p.detach().clone().requires_grad_(True) for p in ref]
        kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        a, b = torch.optim.AdamW(ref, **kw), DeepSpeedCPUAdam(mine, adamw_mode=True, **kw)
        for _ in range(10):
            for p, q in zip(ref, mine):
                g = torch.randn_like(p)
                p.grad, q.grad = g.clone(), g.clone()
            a.step(); b.step()
        print(json.dumps({"max_err": max(float((p - q).abs().max()) for p, q in zip(ref, mine))}))
    """,
        timeout=300,
    )
    assert info["max_err"] < 1e-5, f"DeepSpeedCPUAdam differs from torch's AdamW by {info['max_err']} after 10 steps"


@pytest.mark.static
@pytest.mark.evidence("run")
def test_nvcc_compiles_for_every_declared_gpu(target):
    """Where the image keeps nvcc (DeepSpeed JIT-compiles the ops a config enables later), it is
    the manifest's CUDA, on PATH, and compiles a kernel for every declared GPU plus PTX: the
    headers, cicc, ptxas and fatbinary of the wheel tree all work, without a GPU."""
    comp = compiler(target)
    if not comp["kept"]:
        pytest.skip(f"n/a: nvcc was used to build {target.name} and removed (not kept at run time)")
    gencode = " ".join(f"-gencode arch=compute_{a.replace('.', '')},code={sm(a)}" for a in comp["architectures"])
    last = comp["architectures"][-1].replace(".", "")
    src = r"__global__ void axpy(float a, const float *x, float *y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }"
    r = target.sh(
        f"command -v nvcc && nvcc --version | tail -n 2 && d=$(mktemp -d) && printf '%s\\n' '{src}' > $d/k.cu "
        f"&& nvcc -c {gencode} -gencode arch=compute_{last},code=compute_{last} -o $d/k.o $d/k.cu "
        f"&& {comp['cuobjdump']} --list-elf $d/k.o && {comp['cuobjdump']} --list-ptx $d/k.o",
        timeout=300,
    )
    assert r.rc == 0, (
        f"nvcc could not compile a kernel for {', '.join(comp['architectures'])}: {(r.stderr or r.stdout).strip()[-800:]}"
    )
    major_minor = ".".join(comp["nvcc"].split(".")[:2])
    assert f"release {major_minor}," in r.stdout, f"nvcc on PATH is not CUDA {major_minor}: {r.stdout[:400]}"
    missing = [sm(a) for a in comp["architectures"] if sm(a) not in r.stdout]
    assert not missing, f"the kernel object lacks {missing}: {r.stdout[-600:]}"


@pytest.mark.cpu
@pytest.mark.evidence("run")
def test_torch_cuda_extension_builds_with_the_image_toolchain(target):
    """The JIT path DeepSpeed (and any user's custom op) takes: torch.utils.cpp_extension builds
    a CUDA extension with the image's CUDA_HOME -- nvcc, the headers torch includes, libcudart
    to link -- and the module loads. One architecture here (the build is the point, not the
    list, which the nvcc check covers)."""
    comp = compiler(target)
    if not comp["kept"]:
        pytest.skip(f"n/a: nvcc was used to build {target.name} and removed (not kept at run time)")
    info = py_json(
        target,
        f"""
        import os, tempfile, time
        os.environ["TORCH_CUDA_ARCH_LIST"] = {comp["architectures"][-1]!r}
        from torch.utils.cpp_extension import CUDA_HOME, load_inline
        cuda = '''
        #include <torch/extension.h>
        __global__ void twice(float *x, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }}
        void launch(torch::Tensor x) {{ twice<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), x.numel()); }}
        '''
        t = time.monotonic()
        try:
            m = load_inline("tb_twice", cpp_sources="void launch(torch::Tensor x);", cuda_sources=cuda,
                            functions=["launch"], build_directory=tempfile.mkdtemp(), verbose=False)
        except Exception as e:   # the build's own words (ninja's, nvcc's) are the finding
            print(json.dumps({{"cuda_home": CUDA_HOME, "error": f"{{type(e).__name__}}: {{e}}"[-700:]}}))
            raise SystemExit(0)
        print(json.dumps({{"cuda_home": CUDA_HOME, "module": m.__file__, "seconds": round(time.monotonic() - t)}}))
    """,
        timeout=900,
    )
    assert "error" not in info, (
        f"torch could not build a CUDA extension with the image's CUDA_HOME ({info['cuda_home']}): {info['error']}"
    )
    assert info["cuda_home"] == comp["home"], f"torch finds CUDA at {info['cuda_home']}, the image's is {comp['home']}"
    assert info["module"].endswith(".so"), info
    print(f"a CUDA extension built with {info['cuda_home']} in {info['seconds']} s")


# ----------------------------------------------------------------------------- GPU tier


def probe_lines(stdout: str, probe: str) -> list[dict]:
    """The JSON lines a GPU probe printed (launchers may prefix a rank tag)."""
    marker = '{"probe": "' + probe + '"'
    return [json.loads(ln[ln.index(marker) :]) for ln in stdout.splitlines() if marker in ln]


def one_process_probe(target, probe: str, what: str, timeout: int = 900) -> dict:
    """Run probes/PROBE.py with the image's Python (one process, one GPU) and return its JSON
    line; fails naming WHAT when it printed none, said ok: false or exited non-zero."""
    r = target.sh(f"{target.python} {PROBE_DIR}/{probe}.py", timeout=timeout)
    out = probe_lines(r.stdout, probe)
    assert out, f"the {probe} probe printed nothing (exit {r.rc}): {(r.stderr or r.stdout)[-1500:]}"
    assert out[-1].get("ok") and r.rc == 0, f"{what}: {out[-1]}"
    return out[-1]


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_horovod_nccl_allreduce_of_cuda_tensors(target):
    """Horovod moves CUDA tensors through NCCL: one rank per GPU the host lists, all-reduce /
    all-gather / broadcast value-checked on every rank, then 64 MiB all-reduces timed
    (trainbase_conformance/probes/horovod_gpu.py)."""
    need(target, "horovod")
    mpi = target.need_mpi()
    n = max(target.caps.gpu_count, 1)
    r = target.sh(f"{mpi.local(n)} {target.python} {PROBE_DIR}/horovod_gpu.py", timeout=600)
    ranks = probe_lines(r.stdout, "horovod_gpu")
    assert ranks, f"no rank reported (exit {r.rc}): {(r.stderr or r.stdout)[-1500:]}"
    bad = [x for x in ranks if not x.get("ok")]
    assert not bad, f"Horovod's GPU collectives gave wrong values or failed: {bad}"
    assert r.rc == 0 and len(ranks) == n, f"{len(ranks)} of {n} ranks reported (exit {r.rc}): {r.stderr[-800:]}"
    print(
        f"Horovod NCCL all-reduce on {n} GPU(s): 64 MiB in {ranks[0]['allreduce_64MiB_ms']} ms "
        f"({ranks[0]['algbw_GBps']} GB/s algorithm bandwidth)"
    )


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_deepspeed_fused_adam_steps_on_the_gpu(target):
    """DeepSpeed's prebuilt fused optimizers on the GPU: FusedAdam agrees with torch's AdamW step
    for step, FusedLamb steps, and an engine configured with "AdamW" picks FusedAdam and trains
    (trainbase_conformance/probes/deepspeed_gpu.py). No JIT build is allowed."""
    need(target, "deepspeed")
    out = one_process_probe(target, "deepspeed_gpu", "DeepSpeed's fused optimizers on the GPU")
    print(
        f"FusedAdam vs AdamW max error {out['fused_adam_vs_torch_adamw_max_err']:.1e}; "
        f"engine ({out['engine_optimizer']}) {out['engine_steps_per_s']} steps/s"
    )


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_tensorflow_registers_the_gpus_and_reduces_across_them(target):
    """TensorFlow registers every GPU (a missing CUDA library makes it skip them with a log line
    and run on the CPU), a matmul placed on the GPU matches NumPy, and MirroredStrategy's
    all-reduce over every GPU (NCCL) gives the right sum; matmul throughput printed."""
    need(target, "tensorflow")
    n = max(target.caps.gpu_count, 1)
    info = py_json(
        target,
        """
        import time
        import numpy as np, tensorflow as tf
        gpus = tf.config.list_physical_devices("GPU")
        a, b = np.random.rand(2048, 2048).astype("float32"), np.random.rand(2048, 2048).astype("float32")
        with tf.device("/GPU:0"):
            c = tf.matmul(a, b)
            t = time.perf_counter()
            for _ in range(20):
                d = tf.matmul(c, b)
            _ = d.numpy()
            tflops = 20 * 2 * 2048 ** 3 / (time.perf_counter() - t) / 1e12
        err = float(np.abs(c.numpy() - a @ b).max())
        strategy = tf.distribute.MirroredStrategy()
        per = strategy.run(lambda: tf.constant(1.0) * tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32))
        total = float(strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None))
        print(json.dumps({"gpus": len(gpus), "device": c.device, "max_err": err, "tflops": round(tflops, 1),
                          "replicas": strategy.num_replicas_in_sync, "sum": total}))
    """,
        timeout=600,
    )
    assert info["gpus"] == n, (
        f"TensorFlow registered {info['gpus']} GPU(s), the host has {n}: a CUDA library it loads is missing?"
    )
    assert "GPU:0" in info["device"], f"the matmul ran on {info['device']}, not the GPU"
    assert info["max_err"] < 1e-2, f"the GPU matmul differs from NumPy by {info['max_err']}"
    r = info["replicas"]
    assert r == n and info["sum"] == r * (r + 1) / 2, f"MirroredStrategy over {r} replicas summed {info['sum']}"
    print(f"TensorFlow on {n} GPU(s): 2048^3 matmul {info['tflops']} TFLOP/s (fp32), all-reduce over {r} replicas ok")
