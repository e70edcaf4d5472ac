"""CUDA: runtime, cuBLAS and cuDNN are the versions the manifest names (queried with ctypes,
no GPU needed); nvcc in devel images; gpu tier: device query and a checked kernel.

Expectations come from the manifest's components.cuda and components.cudnn."""

import json

import pytest

from trainbase_common.cuda_requirement import (
    CONSUMER_BRANDS,
    DATA_CENTER_BRANDS,
    DRIVER_BRANCHES,
    Host,
    admits,
    branch_driver,
    branch_of,
)
from trainbase_common.driver_promise import promise_for
from trainbase_conformance.fixtures import PROBE_DIR
from trainbase_conformance.flavors import cuda_version_code, cudnn_version_code

COMPAT_DIR = "/usr/local/cuda/compat"


def _sonames(target) -> dict[str, str]:
    cuda_major = target.components["cuda"]["version"].split(".")[0]
    cudnn_major = target.components["cudnn"]["version"].split(".")[0]
    return {
        "cudart": f"libcudart.so.{cuda_major}",
        "cublas": f"libcublas.so.{cuda_major}",
        "cudnn": f"libcudnn.so.{cudnn_major}",
    }


def _versions(target) -> dict:
    if "cuda" not in target.cache:
        args = " ".join(f"{k}={v}" for k, v in _sonames(target).items())
        target.cache["cuda"] = target.json_probe(f"{target.python} {PROBE_DIR}/libversions.py {args}")
    return target.cache["cuda"]


def _loaded(target, name: str) -> dict:
    info = _versions(target)[name]
    assert "error" not in info, f"{info['soname']}: {info['error']}"
    return info


@pytest.mark.static
@pytest.mark.evidence("load")
def test_cuda_runtime_version(target):
    """cudaRuntimeGetVersion equals the manifest's CUDA (12.8 -> 12080)."""
    want = target.components["cuda"]["version"]
    info = _loaded(target, "cudart")
    assert info["version"] == cuda_version_code(want), (
        f"cudart {info['version']} ({info['path']}), manifest says CUDA {want} = {cuda_version_code(want)}"
    )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_cublas_version(target):
    """cuBLAS belongs to the manifest's CUDA major release and is not older than its minor."""
    want = tuple(int(x) for x in target.components["cuda"]["version"].split(".")[:2])
    info = _loaded(target, "cublas")
    have = tuple(int(x) for x in info["version"].split("."))
    assert have[0] == want[0] and have[:2] >= want, (
        f"cuBLAS {info['version']} ({info['path']}) does not match CUDA {'.'.join(map(str, want))}"
    )


@pytest.mark.static
@pytest.mark.evidence("load")
def test_cudnn_version(target):
    """cudnnGetVersion equals the manifest's cuDNN (9.10.2.21 -> 91002)."""
    want = target.components["cudnn"]["version"]
    info = _loaded(target, "cudnn")
    assert info["version"] == cudnn_version_code(want), (
        f"cudnnGetVersion = {info['version']} ({info['path']}), manifest says {want} = {cudnn_version_code(want)}"
    )


@pytest.mark.static
@pytest.mark.evidence("content")
def test_nvidia_require_cuda(target):
    """NVIDIA_REQUIRE_CUDA lets the container runtime refuse a driver too old for this CUDA."""
    want = target.components["cuda"]["version"]
    env = dict(e.split("=", 1) for e in target.inspect["Config"].get("Env") or [])
    req = env.get("NVIDIA_REQUIRE_CUDA", "")
    assert req.split()[:1] == [f"cuda>={want}"], f"NVIDIA_REQUIRE_CUDA={req!r}, expected it to start with cuda>={want}"


def _image_env(target) -> dict:
    return dict(e.split("=", 1) for e in target.inspect["Config"].get("Env") or [] if "=" in e)


def promise_mismatches(env: dict, promise) -> list[str]:
    """Every driver branch NVIDIA has released, on a data-center and on a consumer GPU: where the
    container runtime's verdict on ``env`` (libnvidia-container's rules) differs from ``promise``."""
    wrong = []
    for branch in sorted(DRIVER_BRANCHES):
        driver = branch_driver(branch)
        for brand in DATA_CENTER_BRANDS + CONSUMER_BRANDS:
            verdict = admits(env, Host.of(driver, brand, "9.0"))
            promised = promise.allows(driver, brand in DATA_CENTER_BRANDS)
            if verdict.starts != promised:
                said = "starts" if verdict.starts else f"is refused ({verdict.message})"
                wrong.append(
                    f"driver {driver} on a {brand} GPU: the catalogue {'promises' if promised else 'excludes'} it, the runtime {said}"
                )
    return wrong


@pytest.mark.static
@pytest.mark.evidence("content")
def test_driver_requirement_keeps_the_catalogues_promise(target):
    """The NVIDIA container runtime starts the image on exactly the drivers the catalogue names
    (docs/images.md's driver column, trainbase_common.driver_promise): its NVIDIA_REQUIRE_*,
    evaluated with libnvidia-container's own rules over every driver branch on a data-center and
    a consumer GPU, admits the first driver of the image's CUDA and, on data-center GPUs, each
    forward-compatibility branch promised, and refuses every other; and the image carries the
    forward-compatibility libraries exactly when it promises such branches, of a branch newer
    than each (libnvidia-container uses them only below their own)."""
    if target.foreign:
        pytest.skip("n/a: an image trainbase did not build makes no promise of the catalogue's")
    cuda, base = target.components["cuda"]["version"], target.components["os"]["base"]
    promise = promise_for(cuda, base)
    wrong = promise_mismatches(_image_env(target), promise)
    assert not wrong, f"NVIDIA_REQUIRE_CUDA disagrees with the catalogue's {promise.text()!r}:\n  " + "\n  ".join(wrong)
    r = target.sh(f"ls {COMPAT_DIR} 2>/dev/null")
    compat = sorted(f for f in r.stdout.split() if f.startswith("libcuda.so.") and f.count(".") > 2)
    if promise.forward_compat:
        assert compat, f"the catalogue promises {promise.text()!r}, but the image has no libcuda in {COMPAT_DIR}"
        newest = max(branch_of(f.removeprefix("libcuda.so.")) for f in compat)
        assert newest > max(promise.forward_compat), (
            f"{COMPAT_DIR}/{compat[-1]} is of branch R{newest}: it cannot serve R{max(promise.forward_compat)}, "
            "which the catalogue promises through it"
        )
    else:
        assert not compat, (
            f"{COMPAT_DIR} holds {', '.join(compat)}, but the catalogue names no forward-compatibility branch "
            f"for the image ({promise.text()!r}): the two disagree on what the image starts on"
        )


@pytest.mark.static
@pytest.mark.evidence("run")
def test_nvcc_in_devel_image(target):
    """Devel images (CUDA from the NVIDIA devel base) have nvcc of the manifest's CUDA."""
    cuda = target.components["cuda"]
    if cuda.get("from") != "base":
        pytest.skip(f"n/a: runtime image (CUDA from {cuda.get('from')}, no toolkit promised)")
    r = target.sh("nvcc --version || /usr/local/cuda/bin/nvcc --version")
    assert r.rc == 0, f"nvcc missing in a devel image: {r.stderr.strip()}"
    assert f"release {cuda['version']}," in r.stdout, f"nvcc is not CUDA {cuda['version']}: {r.stdout.strip()[-200:]}"
    # It compiles and links a kernel with the image's host compiler (no GPU needed to build or
    # to run a main() that never calls CUDA): headers, cudart and the gcc it accepts all agree.
    src = "__global__ void k(int *x) { x[threadIdx.x] = threadIdx.x; }\\nint main() { return 0; }\\n"
    r = target.sh(f"d=$(mktemp -d) && printf '{src}' > $d/k.cu && cd $d && nvcc -o k k.cu && ./k", timeout=300)
    assert r.rc == 0, f"nvcc could not build and run a kernel program: {(r.stderr or r.stdout).strip()[-800:]}"


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_cuda_device_query(target):
    """The driver and runtime see every GPU (name, compute capability): as many as the host's
    `nvidia-smi -L` lists, not just "at least one"."""
    r = target.sh(f"{target.python} {PROBE_DIR}/gpu_probe.py devices {_sonames(target)['cudart']}")
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    assert r.rc == 0 and out.get("ok"), f"device query failed: {out or r.stderr.strip()[-800:]}"
    assert len(out["devices"]) == target.caps.gpu_count, (
        f"the container sees {len(out['devices'])} GPU(s), the host's nvidia-smi -L lists {target.caps.gpu_count}: "
        f"{target.caps.gpu_why} (a CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES baked into the image?)"
    )
    print(f"driver {out['driver']}, runtime {out['runtime']}: {out['devices']}")


@pytest.mark.gpu
@pytest.mark.evidence("run")
def test_cuda_kernel(target):
    """A kernel (PTX, JIT-compiled by the driver) runs and writes the right values."""
    r = target.sh(f"{target.python} {PROBE_DIR}/gpu_probe.py kernel {_sonames(target)['cudart']}")
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    assert r.rc == 0 and out.get("ok"), f"kernel check failed: {out or r.stderr.strip()[-800:]}"
