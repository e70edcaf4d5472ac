"""Strict schema of matrix.yaml (pydantic). Unknown keys are errors: a misspelled option must
never be silently ignored (hpc-container-maker's weak spot)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from trainbase_common import gpu_code as gpu_code_rules

SHA256 = re.compile(r"^[0-9a-f]{64}$")
PIN = re.compile(r"^[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+$")
# A URL that names a moving target: a branch, "latest", a nightly.
MOVING = re.compile(r"(?i)(refs/heads/|/archive/(master|main)\b|[/_=-](latest|master|nightly)([/._-]|$))")
AXES = ("platform", "os", "cuda", "mpi", "ib", "framework")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _pinned(packages: list[str]) -> list[str]:
    for p in packages:
        if not PIN.match(p):
            raise ValueError(f"pip requirement {p!r} is not pinned as NAME==VERSION")
    return packages


Pins = Annotated[list[str], AfterValidator(_pinned)]


OPENPGP_ID = re.compile(r"^([0-9A-F]{16}|[0-9A-F]{40})$")


class PlatformFile(Strict):
    """The same artifact built for another platform: its own URL and its own checksum (a
    per-architecture installer such as Miniforge's aarch64 .sh is a different file)."""

    url: str
    sha256: str
    pending_reason: str | None = None

    @model_validator(mode="after")
    def _checksum(self) -> PlatformFile:
        if self.sha256 == "pending":
            if not self.pending_reason:
                raise ValueError("sha256 is 'pending' without a pending_reason")
        elif not SHA256.match(self.sha256):
            raise ValueError(f"sha256 {self.sha256!r} is not 64 lowercase hex digits")
        return self

    @property
    def pending(self) -> bool:
        return self.sha256 == "pending"


class Artifact(Strict):
    """A downloaded file, pinned by its bytes (sha256) -- or, for a repository signing key only,
    by its OpenPGP identity: a key file is re-exported whenever its signatures or expiry change,
    so its bytes are not stable, but its fingerprint is; the build imports the key, checks the
    fingerprint with gpg and refuses anything else (tb-fetch-openpgp-key).

    ``url``/``sha256`` are the file for the first platform of the axis (linux/amd64);
    ``platforms`` names the file per other platform where it differs (an architecture-specific
    installer). Source tarballs and keys are the same bytes on every platform and need none."""

    url: str
    sha256: str | None = None
    openpgp_fingerprint: str | None = None
    pending_reason: str | None = None
    # true for a file built per architecture: every platform but the first must then name its
    # own file below (never the x86_64 installer run on arm64 by omission)
    architecture_specific: bool = False
    platforms: dict[str, PlatformFile] = {}

    def file_for(self, platform: str) -> Artifact | PlatformFile:
        """The file this artifact is on ``platform``: its own entry there, else the artifact
        itself (the same bytes everywhere: a source tarball, a key)."""
        return self.platforms.get(platform, self)

    @field_validator("url")
    @classmethod
    def _no_moving_refs(cls, v: str) -> str:
        if not v.startswith(("https://", "http://deb.debian.org/")):
            raise ValueError(f"url {v!r} must be https (or Debian's mirror, whose files are checksummed)")
        if MOVING.search(v):
            raise ValueError(f"url {v!r} points at a moving target (latest/master)")
        return v

    @model_validator(mode="after")
    def _checksum(self) -> Artifact:
        if (self.sha256 is None) == (self.openpgp_fingerprint is None):
            raise ValueError(
                "pin an artifact by exactly one of sha256 (its bytes) or openpgp_fingerprint (a signing key's identity)"
            )
        if self.openpgp_fingerprint is not None:
            if not OPENPGP_ID.match(self.openpgp_fingerprint):
                raise ValueError(
                    f"openpgp_fingerprint {self.openpgp_fingerprint!r} is not a 40-digit fingerprint "
                    "or a 16-digit long key ID (uppercase hex, no spaces)"
                )
        elif self.sha256 == "pending":
            if not self.pending_reason:
                raise ValueError("sha256 is 'pending' without a pending_reason")
        elif not SHA256.match(self.sha256 or ""):
            raise ValueError(f"sha256 {self.sha256!r} is not 64 lowercase hex digits")
        return self

    @property
    def pending(self) -> bool:
        return self.sha256 == "pending"


class Platform(Strict):
    """One value of the platform axis (an OCI platform, ``linux/arm64``) and how each source
    names that architecture."""

    arch: Literal["amd64", "arm64"]  # OCI / Docker / Debian architecture
    machine: Literal["x86_64", "aarch64"]  # uname -m, PyPI wheel platform tags
    name_tag: str  # appended to the cell's name (local identity only:
    # the published repository is the same for every platform)
    nvidia_repo: str  # NVIDIA's repository directory: x86_64 | sbsa
    doca_repo: str  # DOCA's repository directory: x86_64 | arm64-sbsa
    # PyPI wheel platform the pip locks of this platform resolve for (glibc of the oldest row)
    wheel_platform: str
    runner: str  # GitHub-hosted runner label that builds it natively
    gpu_runner_label: str  # label of the self-hosted GPU runners for it
    # GB the build runner must offer the engine (after the workflow's free-disk step and the
    # move to /mnt): every cell's disk plan (deliver/disk_plan.py) must fit in it
    runner_disk_gb: float = Field(gt=0)


class Naming(Strict):
    base: str
    framework_prefix: str
    namespace: str


class Bootstrap(Strict):
    suite: str
    mirror: str


class PythonEnv(Strict):
    manager: Literal["venv", "conda"]
    version: str
    installer: str | None = None  # artifact key (conda)

    @model_validator(mode="after")
    def _installer(self) -> PythonEnv:
        if self.manager == "conda" and not self.installer:
            raise ValueError("python.manager conda needs an installer artifact (Miniforge)")
        return self


class SecuritySupport(Strict):
    """The dates a release's security support ends (the distribution's own announcements): the
    catalogue prints them beside every image of the row, and a row past `regular` says so."""

    regular: str  # YYYY-MM-DD: the security team's regular support
    extended: str | None = None  # YYYY-MM-DD: paid or volunteer extended support (Debian LTS, Ubuntu Pro's ESM)
    source: str  # where the dates are announced

    @field_validator("regular", "extended")
    @classmethod
    def _date(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
            raise ValueError(f"support date {v!r} is not YYYY-MM-DD")
        return v


class OsRow(Strict):
    family: Literal["ubuntu", "debian"]
    codename: str
    base: str
    support: SecuritySupport | None = None  # the real matrix gives every row its dates (a unit test)
    # the image the compile stages (UCX, Open MPI) start FROM when the shipped base has no CUDA
    # headers: its toolkit builds CUDA-aware MPI, and none of its bytes reach the image
    build_base: str | None = None
    bootstrap: Bootstrap | None = None
    cuda_from: Literal["base", "wheels"]
    python: PythonEnv
    size_budget_gb: float = Field(gt=0)  # the row's base cells (no framework); frameworks add theirs

    @field_validator("base", "build_base")
    @classmethod
    def _base_pinned(cls, v: str | None) -> str | None:
        if v is None:
            return v
        tag = v.rsplit(":", 1)[-1] if ":" in v else ""
        if (
            not tag
            or tag in ("latest",)
            or re.fullmatch(r"\d+(-slim)?", tag)
            or tag in ("bookworm", "trixie", "noble", "jammy")
        ):
            raise ValueError(f"base image {v!r} must be pinned to a release tag (not latest or a bare codename/major)")
        return v


class Wheel(Strict):
    package: str
    version: str


class CudaRow(Strict):
    toolkit: str
    cudnn_major: int
    # the cuDNN a `cuda_from: base` row's base image ships (its cudnn flavour); no row has one now
    base_cudnn: str | None = None
    nccl: str
    # nvrtc (optional): pinned where a framework's cuda-toolkit pins another than cuBLAS/cuDNN pull in
    wheels: dict[Literal["cuda_runtime", "cublas", "cudnn", "nccl", "nvrtc"], Wheel]
    # CUDA libraries of this toolkit release that no base image carries but a framework loads for
    # its GPU devices (TensorFlow: cuFFT, cuSPARSE, cuSOLVER, ...): installed only in the images of
    # the releases that name them (Release.cuda_libraries), at this row's versions.
    libraries: dict[str, Wheel] = {}
    # The GPUs code compiled in an image targets (compute capabilities, oldest first); the last
    # also gets PTX, which newer GPUs' drivers JIT-compile. Used where an image compiles CUDA
    # (Horovod's NCCL ops, DeepSpeed's prebuilt ops, TORCH_CUDA_ARCH_LIST for later JIT builds).
    architectures: list[str] = Field(min_length=1)
    # NVIDIA's compiler wheels for this row (nvcc and what it needs beside the runtime), for
    # releases that compile CUDA code (Release.cuda_compiler) on OS rows whose CUDA comes from
    # wheels. Empty where no wheel carries nvcc (the cu12 nvcc wheels hold ptxas only).
    compiler: dict[str, Wheel] = {}
    # The header wheels a compile stage without a toolkit needs beside the runtime wheel's
    # include/ (libfabric's CUDA support, aws-ofi-nccl): the crt/ headers cuda_runtime.h includes
    # (cu12's nvcc wheel, cu13's crt wheel) and nvml.h
    build_headers: dict[Literal["crt", "nvml"], Wheel] = {}

    @field_validator("architectures")
    @classmethod
    def _architectures(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.fullmatch(r"\d+\.\d+", a):
                raise ValueError(f"architecture {a!r} is not a compute capability like 9.0")
        if v != sorted(v, key=lambda a: tuple(map(int, a.split(".")))):
            raise ValueError("architectures must be listed oldest first (the last one also gets PTX)")
        return v

    @model_validator(mode="after")
    def _nccl_consistent(self) -> CudaRow:
        missing = {"cuda_runtime", "cublas", "cudnn", "nccl"} - set(self.wheels)
        if missing:
            raise ValueError(f"wheels lacks {sorted(missing)}")
        if self.wheels["nccl"].version != self.nccl:
            raise ValueError(f"nccl {self.nccl} differs from the NCCL wheel {self.wheels['nccl'].version}")
        return self


class UcxChoice(Strict):
    source: Literal["distro", "source", "doca"] = Field(alias="from")
    version: str
    artifact: str | None = None

    @model_validator(mode="after")
    def _artifact(self) -> UcxChoice:
        if self.source == "source" and not self.artifact:
            raise ValueError("ucx from source needs an artifact")
        return self


class IbRow(Strict):
    kind: Literal["rdma-core", "doca-ofed"]
    name_tag: str
    providers: list[str]
    # by OS family, or by OS row where one release of a family ships another UCX than the
    # others (Debian 13's libucx0 is 1.18.1, Debian 12's 1.13.1): the row's key wins
    ucx: dict[str, UcxChoice]
    version: str | None = None
    package_version: str | None = None
    repo: str | None = None
    key: str | None = None

    def ucx_for(self, os_row: str, family: str) -> UcxChoice:
        """The UCX of a cell on OS row ``os_row`` (of ``family``): the row's own entry, else the
        family's (KeyError where neither is declared)."""
        return self.ucx[os_row] if os_row in self.ucx else self.ucx[family]

    @model_validator(mode="after")
    def _doca(self) -> IbRow:
        if self.kind == "doca-ofed" and not (self.version and self.package_version and self.repo and self.key):
            raise ValueError("doca-ofed needs version, package_version, repo and key")
        return self


class MpiRow(Strict):
    kind: Literal["openmpi", "intelmpi"]
    version: str
    install: Literal["source", "pypi"]
    artifact: str | None = None
    packages: Pins = []
    # A UCX the MPI package bundles and loads instead of the image's (the PyPI Open MPI wheel):
    # the manifest then names this one, since it is the UCX the MPI really uses.
    bundled_ucx: str | None = None
    # Libraries a source-built Open MPI takes from the distro instead of compiling the copies its
    # tarball embeds (configure's --with-hwloc/--with-libevent=external, --with-pmix=DIR).
    system_libs: list[Literal["hwloc", "libevent", "pmix"]] = []

    @model_validator(mode="after")
    def _how(self) -> MpiRow:
        if self.install == "source" and not self.artifact:
            raise ValueError("install: source needs an artifact")
        if self.install == "pypi" and not self.packages:
            raise ValueError("install: pypi needs packages")
        if self.kind == "intelmpi" and self.install != "pypi":
            raise ValueError("Intel MPI is installed from PyPI (impi-rt)")
        if self.system_libs and (self.kind != "openmpi" or self.install != "source"):
            raise ValueError("system_libs is for an Open MPI built from source (configure's external libraries)")
        return self


class Patch(Strict):
    file: str
    sha256: str

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not SHA256.match(v):
            raise ValueError(f"patch sha256 {v!r} is not 64 lowercase hex digits")
        return v


class RefusedArchitectures(Strict):
    # compute capabilities ("10.0"); one no row of the release declares refuses nothing (a row
    # dropped later need not edit this list)
    architectures: list[Annotated[str, Field(pattern=r"^[1-9][0-9]?\.[0-9]$")]] = Field(min_length=1)
    reason: str


class Release(Strict):
    version: str
    cuda: list[str]
    nccl: str | None = None
    packages: Pins = []
    build_packages: Pins = []  # needed in the env before an sdist builds (--no-build-isolation)
    requires: dict[str, str] = {}
    artifact: str | None = None
    patch: Patch | None = None
    # keys of each of its CUDA rows' `libraries`: what it loads beyond the image's runtime,
    # cuBLAS, cuDNN and NCCL (checked against every row in `cuda`)
    cuda_libraries: list[str] = []
    # Whether the release compiles CUDA code: "build" (nvcc only while its layer builds, then
    # removed: Horovod's NCCL ops), "runtime" (nvcc kept, for ops users enable later: DeepSpeed
    # JIT-compiles them on first use), or "none".
    cuda_compiler: Literal["none", "build", "runtime"] = "none"
    # ops compiled when the release installs, for the row's architectures (DeepSpeed: each is
    # DS_BUILD_<OP>=1); what is not listed is compiled on first use where nvcc is kept
    prebuilt_ops: list[str] = []
    # What this release's own layers may add on top of its parent image: a cell's size budget
    # is its OS row's base budget plus the increments of every framework in its chain, so one
    # release serves rows whose bases differ in size (a CUDA devel base vs a slim one).
    size_increment_gb: float = Field(gt=0)
    # The GPU code the release's own wheel carries, per platform, as the wheel itself reports it
    # (torch._C._cuda_getArchFlags(), tf.sysconfig.get_build_info()["cuda_compute_capabilities"]):
    # sm_XY is machine code (it runs on X.Y and the newer GPUs of major X), compute_XY is PTX (any
    # GPU from X.Y on JIT-compiles it at first use). A platform given a sentence instead is one
    # whose wheel has no CUDA build (PyPI's aarch64 torch 2.10.0 is 2.10.0+cpu): its cells are
    # excluded with that sentence. The static tier checks the list against the image's wheel.
    gpu_code: dict[str, list[str] | str] = {}
    # GPUs the release does not run on although its row declares them, and why (TensorFlow's
    # XLA on Blackwell): the catalogue and the image's manifest say the image is not built for them
    refused_architectures: RefusedArchitectures | None = None

    @field_validator("gpu_code")
    @classmethod
    def _gpu_code(cls, v: dict[str, list[str] | str]) -> dict[str, list[str] | str]:
        for platform, code in v.items():
            if isinstance(code, str):
                continue
            bad = [c for c in code if not gpu_code_rules.CODE.match(c)]
            if bad or not code:
                raise ValueError(
                    f"gpu_code[{platform}]: {bad or 'an empty list'} is not GPU code as the wheel names it "
                    "(sm_90, sm_90a, compute_90), nor a sentence saying why the wheel has none"
                )
        return v


class Framework(Strict):
    parent: str | None = None
    # its PyPI distribution, where that is not its key (pytorch: torch): a release's pin of it
    # must be the release's own version (a bumped pin with an old `version:` is refused)
    distribution: str | None = None
    releases: list[Release] = []
    # why the CUDA rows no release lists have none, where that is a decision and not just "not
    # yet released": `explain` adds it to the exclusion (a rule naming CUDA versions would break
    # the day a version is dropped)
    unreleased_reason: str | None = None


class PythonPackages(Strict):
    packages: Pins


class Rule(Strict):
    id: str
    when: dict[str, str | list[str]]
    require: dict[str, str | list[str]] | None = None
    reason: str

    @field_validator("when", "require")
    @classmethod
    def _axes(cls, v: dict[str, str | list[str]] | None) -> dict[str, str | list[str]] | None:
        if v is None:
            return v
        for k in v:
            if k not in AXES:
                raise ValueError(f"unknown axis {k!r} (axes: {', '.join(AXES)})")
        return {k: [x] if isinstance(x, str) else list(x) for k, x in v.items()}


class Profile(Strict):
    select: dict[str, str | list[str]] | None = None
    cells: list[str] | None = None

    @model_validator(mode="after")
    def _one(self) -> Profile:
        if (self.select is None) == (self.cells is None):
            raise ValueError("a profile has exactly one of select or cells")
        return self


class Axes(Strict):
    platform: list[str] = Field(min_length=1)
    os: list[str] = Field(min_length=1)
    cuda: list[str] = Field(min_length=1)
    mpi: list[str] = Field(min_length=1)
    ib: list[str] = Field(min_length=1)
    framework: list[str] = Field(min_length=1)


class Hold(Strict):
    """A pin held back on purpose: `build.py --outdated` reports it as held (with the reason),
    not as behind, and `--bump` leaves it. ``below``: releases from this version on are held
    (a known regression, an upstream incompatibility); ``series``: releases outside the pin's
    own major.minor are held (a CUDA row's toolkit wheels: a newer CUDA is a new row, not a
    bump), while a release in its series is still a bump; neither: the pin itself is held.
    ``where``: only the pins at matrix.yaml paths that start with it (``cuda.12.8``).
    ``package``: one name, or a list that shares the reason."""

    package: str | list[str]
    below: str | None = None
    series: bool = False
    where: str | None = None
    reason: str
    upstream: str | None = None  # the upstream issue or release note that says why

    @field_validator("where")
    @classmethod
    def _named_not_numbered(cls, v: str | None) -> str | None:
        # a list position moves when a release is inserted (oldest first): the hold and its
        # reason would silently land on another release (issue 65)
        if v is not None and re.search(r"\[\d+\]", v):
            named = re.sub(r"\[\d+\]", "[version=X.Y.Z]", v)
            raise ValueError(
                f"{v!r} names a list position, which moves when an entry is added; name the entry "
                f"by its version instead: {named}"
            )
        return v

    @field_validator("below")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None:
            from packaging.version import Version

            Version(v)
        return v


GIT_ID = re.compile(r"^[0-9a-f]{40}$")
GITHUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


SOURCE_STAGE_DIR = "build-sources"  # under the checkout: the verified archives the Dockerfiles mount


def staged_source(key: str) -> str:
    """Where a cell's Dockerfile finds source ``key``'s verified archive, relative to the build
    context (build.py stages it there before the build: trainbase/build/sources.py)."""
    return f"{SOURCE_STAGE_DIR}/{key}.tar.gz"


class Source(Strict):
    """An upstream source tree that no package registry ships (aws-ofi-nccl, libfabric, gdrcopy,
    nccl-tests, ucc), pinned by its commit and by its content: the git tree id of the unpacked
    archive (`git add -A -f && git write-tree` in its top folder). GitHub's archive of the commit
    and a mirror's `git archive` of it have other bytes (another gzip) but that one tree, so both
    ways of getting it are verified the same way (trainbase/build/sources.py)."""

    repository: str  # owner/name on GitHub
    tag: str  # the release tag the commit is (for people and `--outdated`; never fetched by)
    commit: str
    tree: str
    # the archive's file name in a source mirror (TRAINBASE_SOURCE_MIRROR, ../shared/sources)
    mirror_file: str

    @field_validator("repository")
    @classmethod
    def _github_repo(cls, v: str) -> str:
        if not GITHUB_REPO.match(v):
            raise ValueError(f"repository {v!r} is not a GitHub owner/name")
        return v

    @field_validator("commit", "tree")
    @classmethod
    def _git_id(cls, v: str) -> str:
        if not GIT_ID.match(v):
            raise ValueError(f"{v!r} is not a 40-digit lowercase git object id")
        return v

    @field_validator("mirror_file")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if "/" in v or not v.endswith(".tar.gz"):
            raise ValueError(f"mirror_file {v!r} is not a plain NAME.tar.gz")
        return v


class SourceBuilt(Strict):
    """A component built from a pinned source (``sources``), at the version that source is."""

    version: str
    source: str  # a key of matrix.yaml's sources


class PlatformScoped(SourceBuilt):
    """A source-built component that only some platforms carry (each omission says why in
    matrix.yaml)."""

    platforms: list[str]


class Libfabric(PlatformScoped):
    """libfabric, built with exactly these providers (configure --enable-<p>, the rest disabled)."""

    providers: list[str]


class NcclNetPlugin(PlatformScoped):
    """An NCCL network plugin built against the image's NCCL interface and CUDA: its project
    (``name``), the libfabric provider it serves (``fabric``), and its platform support."""

    name: str
    fabric: str
    # the plugin's platform support compiled in (aws-ofi-nccl's --enable-platform-aws): without
    # it, aws-ofi-nccl turns AWS support on only when the build itself runs on EC2
    platform_support: str | None = None


class NcclTests(PlatformScoped):
    """nccl-tests: the benchmark binaries it installs (``binaries``, each <collective>_perf) and the
    architectures its device code is compiled for, as PTX only (``ptx``: JIT-compiled on any GPU of
    that capability or newer)."""

    binaries: list[str] = Field(min_length=1)
    ptx: list[str] = Field(min_length=1)

    @field_validator("binaries")
    @classmethod
    def _perf_binaries(cls, v: list[str]) -> list[str]:
        bad = [b for b in v if not re.fullmatch(r"[a-z_]+_perf", b)]
        if bad:
            raise ValueError(f"binaries {bad} are not nccl-tests' <collective>_perf names")
        return v

    @field_validator("ptx")
    @classmethod
    def _compute_capabilities(cls, v: list[str]) -> list[str]:
        bad = [a for a in v if not re.fullmatch(r"[0-9]+\.[0-9]", a)]
        if bad:
            raise ValueError(f"ptx {bad}: give compute capabilities as MAJOR.MINOR (8.0)")
        return v


class Fabric(Strict):
    """The fabric libraries every image carries beside its MPI and NCCL (issue 70): each one a
    block of its own (templates/blocks/<name>.j2, trainbase/render/components/<name>.py) and a
    check module (trainbase_conformance/checks/test_<name>.py)."""

    # GDRCopy's userspace library (libgdrapi): CPU-mapped GPU memory for UCX's gdr_copy and
    # NCCL; the gdrdrv kernel module it talks to stays the node's
    gdrcopy: SourceBuilt | None = None
    # libfabric with the providers named: what NCCL's OFI plugin and Open MPI's OFI MTL talk to
    libfabric: Libfabric | None = None
    # the NCCL network plugin NCCL dlopens by itself (libnccl-net.so) on the fabric it serves
    nccl_net_plugin: NcclNetPlugin | None = None
    # nccl-tests' benchmarks against the image's MPI, NCCL and cudart, where the row has nvcc
    nccl_tests: NcclTests | None = None

    @model_validator(mode="after")
    def _plugin_has_its_libfabric(self) -> Fabric:
        p, lf = self.nccl_net_plugin, self.libfabric
        if p is not None and p.fabric not in (lf.providers if lf else []):
            raise ValueError(
                f"fabric.nccl_net_plugin: {p.name} serves {p.fabric!r}, which fabric.libfabric's providers "
                f"({', '.join(lf.providers) if lf else 'none: no libfabric declared'}) do not include"
            )
        if p is not None and lf is not None and not set(p.platforms) <= set(lf.platforms):
            raise ValueError(
                f"fabric.nccl_net_plugin: {p.name} is declared for {sorted(set(p.platforms) - set(lf.platforms))}, "
                "where fabric.libfabric is not built"
            )
        return self

    def on(self, platform: str, ib_providers: list[str], mpi_install: str = "source") -> dict[str, SourceBuilt]:
        """The fabric components a cell of this platform, IB row (its verbs providers) and MPI
        carries, by name. libfabric's efa provider, and the plugin on it, are built on rdma-core's
        libefa: a row without the efa verbs provider (DOCA-OFED's: mlx5 only) carries neither.
        Nor does a cell whose MPI comes from PyPI: Intel MPI's wheel ships its own libfabric.so.1
        (2.4.0-impi, with its mlx provider), the mpi4py project's Open MPI wheel another (and its
        own hwloc), and a process holds one library of a soname, so the plugin would run on
        whichever the process loaded first (test_one_copy_of_each_library found the second)."""
        efa = self.nccl_net_plugin.fabric if self.nccl_net_plugin else "efa"
        out: dict[str, SourceBuilt] = {}
        for name, built in self:
            if built is None or (isinstance(built, PlatformScoped) and platform not in built.platforms):
                continue
            if isinstance(built, Libfabric | NcclNetPlugin) and (efa not in ib_providers or mpi_install != "source"):
                continue
            out[name] = built
        return out


# A distro package's name on every OS row: one name for all, or {name: [os rows]} where the
# releases disagree (the 2024 64-bit time_t transition renamed libpmix2 to libpmix2t64 on
# Ubuntu 24.04 and Debian 13). Each row must get exactly one name (MatrixFile checks).
DistroPackage = str | dict[str, list[str]]


class MatrixFile(Strict):
    schema_version: Literal[1]
    naming: Naming
    axes: Axes
    artifacts: dict[str, Artifact]
    platforms: dict[str, Platform]
    os: dict[str, OsRow]
    cuda: dict[str, CudaRow]
    ib: dict[str, IbRow]
    mpi: dict[str, MpiRow]
    python: PythonPackages
    frameworks: dict[str, Framework]
    rules: list[Rule] = []
    holds: list[Hold] = []
    profiles: dict[str, Profile] = {}
    # the apt package names every block installs, by what they are (pmix-runtime, verbs-dev ...)
    distro_packages: dict[str, DistroPackage] = {}
    # source trees no registry ships, by commit and tree id (Source)
    sources: dict[str, Source] = {}
    fabric: Fabric = Fabric()

    @model_validator(mode="after")
    def _fabric_sources_are_pinned(self) -> MatrixFile:
        for name, built in self.fabric:
            if built is not None and built.source not in self.sources:
                raise ValueError(
                    f"fabric.{name}: source {built.source!r} is not one of sources ({', '.join(self.sources)})"
                )
            unknown = sorted(set(getattr(built, "platforms", [])) - set(self.platforms))
            if unknown:
                raise ValueError(f"fabric.{name}: platforms {unknown} are not platforms ({', '.join(self.platforms)})")
        return self

    @model_validator(mode="after")
    def _one_name_per_row(self) -> MatrixFile:
        for what, names in self.distro_packages.items():
            if isinstance(names, str):
                continue
            seen: dict[str, str] = {}
            for name, rows in names.items():
                for row in rows:
                    if row not in self.os:
                        raise ValueError(f"distro_packages.{what}: {name} names os row {row!r}, which os has not")
                    if row in seen:
                        raise ValueError(f"distro_packages.{what}: os row {row} has two names ({seen[row]}, {name})")
                    seen[row] = name
            missing = sorted(set(self.os) - set(seen))
            if missing:
                raise ValueError(f"distro_packages.{what}: no name for os row(s) {', '.join(missing)}")
        return self

    def package_name(self, what: str, os_key: str) -> str:
        names = self.distro_packages[what]
        if isinstance(names, str):
            return names
        return next(name for name, rows in names.items() if os_key in rows)
