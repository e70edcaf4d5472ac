"""The frameworks' GPU paths, proven without a GPU: what a framework loads or runs the moment a
job puts a tensor on a GPU must already be in the image and resolve -- otherwise the job fails
(or, worse, silently falls back to the CPU) on the GPU node, not here."""
from __future__ import annotations

import pytest

from trainbase_conformance.checks.test_frameworks import need, py_json


@pytest.mark.static
@pytest.mark.evidence("load")
def test_tensorflow_gpu_libraries_resolve(target):
    """Every CUDA library TensorFlow's GPU devices load -- the NVIDIA packages its own
    `and-cuda` extra names -- is installed and each of its shared libraries loads by soname
    (as TF dlopens them). TF without, e.g., cuFFT registers no GPU and runs on the CPU with
    nothing but a log line."""
    need(target, "tensorflow")
    info = py_json(target, """
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
    """)
    assert info["wanted"], "tensorflow's metadata names no and-cuda extra: cannot tell what its GPU devices load"
    assert not info["missing"], (f"TensorFlow's GPU devices need {', '.join(info['missing'])}, not installed: TF would "
                                 f"skip registering the GPUs and run on the CPU")
    assert not info["unloadable"], f"CUDA libraries TensorFlow loads do not resolve by soname: {info['unloadable']}"
    # an older patch release than TF's floor (the NCCL the image shares with PyTorch) is said, not failed:
    # the soname -- the ABI -- is what loading proves
    print(f"{len(info['loaded'])} CUDA libraries load: {', '.join(sorted(info['loaded']))}"
          + (f"; below TF's floor: {info['old']}" if info["old"] else ""))
