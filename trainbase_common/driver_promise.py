"""Which NVIDIA drivers an image starts on: the promise the catalogue prints (docs/images.md's
driver column, docs/images.json's ``min_driver`` and ``forward_compat_branches``) and the
conformance suite holds the built image to, by evaluating its NVIDIA_REQUIRE_CUDA with the
container runtime's own rules (trainbase_common.cuda_requirement).

An image promises two ways to start:
- natively: a driver whose CUDA version (the runtime's ``cuda`` key) is at least the image's
  CUDA row -- the first driver of that CUDA's branch (``first_driver_for``);
- through CUDA forward compatibility, only where the image carries NVIDIA's compat libraries
  (/usr/local/cuda/compat, the cuda-compat-X-Y package of the ``nvidia/cuda`` bases) and only on
  data-center GPUs: the driver branches the base's own NVIDIA_REQUIRE_CUDA admits with its
  ``brand=B,driver>=N,driver<N+1`` alternatives, which are the branches that compat package
  supports. Images on another base (debian:*-slim, CUDA from NVIDIA's wheels) carry no compat
  libraries and promise the native way only.

NVIDIA_CUDA_BASES records, per ``nvidia/cuda`` toolkit tag, the branches its base flavour's
NVIDIA_REQUIRE_CUDA lists (every brand of NVIDIA_BRANDS on every branch, in that order: ``
nvidia_require_cuda`` rebuilds the value). The image's own value is what the static conformance
check evaluates, so a base that changes it is caught on the built image."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .cuda_requirement import branch_of, cuda_of, first_driver_for, forward_compat, version_tuple

# The brands nvidia/cuda 12.8 to 13.2 list in every forward-compatibility alternative, in their order.
NVIDIA_BRANDS = (
    "unknown",
    "grid",
    "tesla",
    "nvidia",
    "quadro",
    "quadrortx",
    "nvidiartx",
    "vapps",
    "vpc",
    "vcs",
    "vws",
    "cloudgaming",
)
_DIST = (
    "gitlab.com/nvidia/container-images/cuda dist/{v}/ubuntu2404/base/Dockerfile (ubuntu2204: the same "
    "value), read in its mirror github.com/pranavmishra90/nvidia-container-images-cuda at 60a1c89"
)
# toolkit tag -> (the branches its base's NVIDIA_REQUIRE_CUDA admits through forward compatibility, where read)
NVIDIA_CUDA_BASES: dict[str, tuple[tuple[int, ...], str]] = {
    "12.8.1": ((470, 535, 550, 560, 565), _DIST.format(v="12.8.1")),
    "12.9.1": ((535, 550, 560, 565, 570), _DIST.format(v="12.9.1")),
    "13.0.1": (
        (535, 550, 565, 570, 575),
        _DIST.format(v="13.0.0") + "; the same in nvidia/cuda:13.0.2's image config (vllm/vllm-openai:v0.23.0)",
    ),
    "13.2.1": (
        (535, 570, 580, 590),
        "the image config of nvidia/cuda:13.2.0-devel-ubuntu24.04 (linux/arm64, docker inspect); 13.2.1's "
        "own not read: kserve's copy of it names the same branches for brands tesla, nvidia and nvidiartx",
    ),
}
_CUDA_BASE = re.compile(r"^(?:docker\.io/)?nvidia/cuda:(\d+\.\d+\.\d+)-(?:[a-z-]+-)?(?:base|runtime|devel)-")


def nvidia_toolkit(base: str) -> str | None:
    """12.8.1 for nvidia/cuda:12.8.1-base-ubuntu24.04 (a digest after @ is ignored); None for a base
    that is not NVIDIA's CUDA image."""
    m = _CUDA_BASE.match(base.partition("@")[0])
    return m.group(1) if m else None


def nvidia_require_cuda(toolkit: str) -> str:
    """NVIDIA_REQUIRE_CUDA as nvidia/cuda:<toolkit>-base-* sets it (KeyError: not recorded)."""
    branches, _ = NVIDIA_CUDA_BASES[toolkit]
    major_minor = ".".join(toolkit.split(".")[:2])
    alternatives = [f"brand={b},driver>={n},driver<{n + 1}" for n in branches for b in NVIDIA_BRANDS]
    return " ".join([f"cuda>={major_minor}", *alternatives])


def base_requirement(base: str) -> str | None:
    """The NVIDIA_REQUIRE_CUDA an image FROM ``base`` inherits: nvidia/cuda's recorded value, None
    for a base that sets none (debian:*); KeyError for an nvidia/cuda tag not recorded here."""
    toolkit = nvidia_toolkit(base)
    return None if toolkit is None else nvidia_require_cuda(toolkit)


@dataclass(frozen=True)
class DriverPromise:
    cuda: str  # the image's CUDA row, MAJOR.MINOR
    native: str | None  # the oldest driver whose CUDA is at least that (None: newer than the table)
    forward_compat: tuple[int, ...] = ()  # the branches admitted on data-center GPUs through the compat libraries

    @property
    def min_driver(self) -> str:
        return f">= {self.native}" if self.native else f"a driver for CUDA {self.cuda}"

    def text(self) -> str:
        """The catalogue's driver column."""
        native = f"{self.native}+" if self.native else f"a driver for CUDA {self.cuda}"
        if not self.forward_compat:
            return native
        branches = "/".join(f"R{b}" for b in self.forward_compat)
        return f"{native}, or {branches} on data-center GPUs (forward compatibility)"

    def allows(self, driver: str, data_center: bool) -> bool:
        """Whether the promise says the image starts on ``driver`` (on a data-center GPU or not)."""
        have = cuda_of(driver)
        if have is None or version_tuple(have) >= version_tuple(self.cuda):
            return True
        return data_center and branch_of(driver) in self.forward_compat


def promise_for(cuda: str, base: str, locked_env: list[str] | None = None) -> DriverPromise:
    """The promise of an image of CUDA row ``cuda`` (12.8) built FROM ``base``. The base's own
    NVIDIA_REQUIRE_CUDA decides its forward-compatibility branches: the value its lock recorded
    from the image config (``locked_env``, locks/bases.json's ``env``) where there is one, else
    the value NVIDIA_CUDA_BASES records for its tag. An nvidia/cuda tag recorded in neither (a
    CUDA row just added) promises the native driver only: never a driver the image may refuse;
    `build.py check` names the tag (unrecorded_bases), and the static check on the built image
    finds any branch its requirement admits beyond that."""
    recorded = next((e.partition("=")[2] for e in locked_env or () if e.startswith("NVIDIA_REQUIRE_CUDA=")), None)
    if recorded is not None:
        return DriverPromise(cuda, first_driver_for(cuda), forward_compat(recorded).branches)
    toolkit = nvidia_toolkit(base)
    branches = NVIDIA_CUDA_BASES[toolkit][0] if toolkit in NVIDIA_CUDA_BASES else ()
    return DriverPromise(cuda, first_driver_for(cuda), tuple(branches))


def unrecorded(bases: list[str]) -> list[str]:
    """The nvidia/cuda toolkit tags among ``bases`` whose forward-compatibility branches
    NVIDIA_CUDA_BASES does not record."""
    return sorted({t for b in bases if (t := nvidia_toolkit(b)) and t not in NVIDIA_CUDA_BASES})
