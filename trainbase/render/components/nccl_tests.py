"""nccl-tests (matrix.yaml's fabric.nccl_tests): the collectives' benchmarks, from their pinned
source, built MPI=1 against the image's own MPI and linked by soname to the image's one NCCL and
cudart, where the cell's row has an nvcc to build them with.

nvcc comes from the Ubuntu rows' CUDA devel toolchain stage (bind-mounted into the build step, so
no toolkit byte reaches a layer) or, on a wheel row, from NVIDIA's compiler wheels of the row
(cuda.<row>.compiler: the CUDA 13 rows), installed into a scratch folder of the same step and laid
out as one toolkit tree with the image's runtime headers. A CUDA 12 wheel row has none (NVIDIA's
cu12 nvcc wheel carries ptxas only): its cells carry no nccl-tests."""

from __future__ import annotations

from .cuda import runtime_tree
from .facts import Block, Facts
from .mpi import OPENMPI_PREFIX

NCCL_TESTS_PREFIX = "/opt/nccl-tests"
# where the Ubuntu rows' toolkit (the toolchain stage's /usr/local/cuda-X.Y) is mounted for the one
# RUN that builds, and where a wheel row's compiler wheels are installed in it (their one CUDA
# tree, nvidia/cu<major>, gets the image's runtime headers beside nvcc's own: nvcc finds its
# include/ from where its binary really is, so the headers go into that tree, not a tree of links)
TOOLKIT_MOUNT = "/tmp/nccl-tests-cuda"  # noqa: S108 (paths inside a build step, not this machine's)
COMPILER_WHEELS = "/tmp/nccl-tests-wheels"  # noqa: S108


def has_nvcc(f: Facts) -> bool:
    """Whether the cell's row has an nvcc for the image's build steps: a CUDA devel toolchain, or
    NVIDIA's compiler wheels for its CUDA row."""
    return f.osr.build_base is not None or bool(f.cu.compiler)


def block(f: Facts) -> Block:
    built = f.spec.fabric.on(f.cell.platform, f.ibr.providers, f.mpir.install).get("nccl_tests")
    spec = f.spec.fabric.nccl_tests
    if built is None or spec is None or not has_nvcc(f):
        return Block(None)
    missing = [a for a in spec.ptx if a not in f.cu.architectures]
    if missing:
        raise ValueError(
            f"{f.cell.name}: fabric.nccl_tests.ptx {missing} is not among cuda {f.cell.cuda}'s architectures "
            f"{f.cu.architectures}: its nvcc is not declared to target them"
        )
    source = f.source(built.source)
    major = f.cell.cuda.split(".")[0]
    site = f"{f.python_prefix}/lib/python{f.py}/site-packages"
    from_wheels = f.osr.build_base is None
    compiler_lock = None
    if from_wheels:
        # the framework blocks' compiler set (the same file: same pins, same context)
        pins = [f"{w.package}=={w.version}" for w in f.cu.compiler.values()]
        compiler_lock = f.lock(f"cuda{f.cell.cuda}-compiler-{f.python_tag}", pins, f.image_pins)
    mpi_home = OPENMPI_PREFIX if f.mpir.install == "source" else f.python_prefix
    bin_dir = f"{NCCL_TESTS_PREFIX}/build"
    binaries = [f"{bin_dir}/{b}" for b in spec.binaries]
    return Block(
        {
            "version": built.version,
            "source": source,
            "prefix": NCCL_TESTS_PREFIX,
            "bin_dir": bin_dir,
            "binaries": spec.binaries,
            "gencode": " ".join(
                f"-gencode=arch=compute_{a.replace('.', '')},code=compute_{a.replace('.', '')}" for a in spec.ptx
            ),
            "ptx": list(spec.ptx),
            # nvcc: the toolchain stage's toolkit (its versioned folder: /usr/local/cuda is a link
            # through /etc/alternatives, which a mount does not follow), or the compiler wheels
            "toolkit_mount": None if from_wheels else f"/usr/local/cuda-{f.cell.cuda}",
            "compiler_lock": compiler_lock.path if compiler_lock else None,
            "cuda_home": f"{COMPILER_WHEELS}/nvidia/cu{major}" if from_wheels else TOOLKIT_MOUNT,
            "compiler_wheels": COMPILER_WHEELS,
            # the image's runtime wheel tree: the headers (cuda_runtime.h) and libcudadevrt.a
            # the compiler wheels do not carry
            "runtime_tree": runtime_tree(f),
            "cudart": f"{runtime_tree(f)}/lib/libcudart.so.{major}",
            "nccl_home": f"{site}/nvidia/nccl",
            "mpi_home": mpi_home,
        },
        locks=(compiler_lock,) if compiler_lock else (),
        sources=(built.source,),
        manifest={
            "version": built.version,
            "from": "source",
            "commit": source["commit"],
            "prefix": NCCL_TESTS_PREFIX,
            "binaries": binaries,
            "mpi": True,
            "ptx": list(spec.ptx),
        },
    )
