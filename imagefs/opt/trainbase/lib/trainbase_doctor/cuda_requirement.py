"""NVIDIA_REQUIRE_* as the NVIDIA container runtime evaluates them before a container starts, and
the driver branches they are evaluated against.

ONE SOURCE, TWO PLACES: this file is trainbase_common/cuda_requirement.py (the catalogue, the unit
tests and the conformance suite import it) and, byte for byte, the in-image doctor's
imagefs/opt/trainbase/lib/trainbase_doctor/cuda_requirement.py (tb-doctor imports nothing outside
its own directory); tests/unit/test_cuda_requirement.py keeps the two equal. Edit this one, copy it
over. Standard library only, and Python 3.8 at run time (the doctor runs under any python3).

The rules, as written in the sources they come from (read November 2026):

NVIDIA/nvidia-container-toolkit, which collects the requirements
  internal/config/image/cuda_image.go, ``CUDA.GetRequirements``: "All variables with the
  "NVIDIA_REQUIRE_" prefix are passed to nvidia-container-cli" -- every NVIDIA_REQUIRE_* of the
  container's environment except NVIDIA_REQUIRE_JETPACK*, none at all when ``HasDisableRequire``:
  NVIDIA_DISABLE_REQUIRE parsed by Go's strconv.ParseBool (1 t T TRUE true True; anything else,
  including an unparsable value, leaves the checks on). ``IsLegacy``: "An image is considered
  legacy if it has a CUDA_VERSION environment variable defined and no NVIDIA_REQUIRE_CUDA
  environment variable defined" -- it then requires ``cuda>=MAJOR.MINOR`` of CUDA_VERSION (an
  unparsable CUDA_VERSION fails the hook).
  cmd/nvidia-container-runtime-hook/main.go, ``doPrestart``: each one becomes ``--require=EXPR``
  of ``nvidia-container-cli configure``. (Only this legacy path, and the CSV mode of
  internal/modifier/csv.go, read them: a container started through CDI specs is not checked.)

NVIDIA/libnvidia-container, which evaluates them
  src/cli/configure.c, ``configure_command``: "Check the container requirements. Try evaluating
  per visible device first, and globally otherwise": every requirement against every visible GPU
  (and, once, without a device when none is visible); the first failure refuses the container
  ("requirement error: ..."). Its rules table: {"cuda", check_cuda_version}, {"driver",
  check_driver_version}, {"arch", check_device_arch}, {"brand", check_device_brand}:
    cuda    the CUDA version the driver supports (nvmlSystemGetCudaDriverVersion as MAJOR.MINOR,
            src/driver.c ``driver_get_cuda_version``), compared as a version;
    driver  the driver's version (nvmlSystemGetDriverVersion, e.g. 550.54.15), as a version;
    arch    the device's compute capability "MAJOR.MINOR", as a version;
    brand   the device's brand, as a string: src/driver.c ``driver_get_device_brand_1_svc`` names
            NVML_BRAND_QUADRO "Quadro", _TESLA "Tesla", _NVS "NVS", _GRID "GRID", _GEFORCE
            "GeForce", _TITAN "TITAN" and every other brand "Unknown" -- NVML_BRAND_NVIDIA, the
            brand of A100/H100/B200, among them: nvidia/cuda's requirements list brand=unknown
            next to brand=nvidia for that reason;
    a rule with nothing to read (no driver information, no visible device) is satisfied.
  src/cli/dsl.c, ``dsl_evaluate``: the expression is split at spaces ("or_expr = strsep(&ptr,
  " ")") into alternatives, each at commas ("and_expr = strsep(&or_expr, ",")") into conditions;
  empty pieces are skipped; the first alternative whose conditions all hold satisfies it; else
  "unsatisfied condition: <first alternative>" (with ", please update your driver to a newer
  version, or use an earlier cuda container" when that starts with cuda>=). ``evaluate_rule``:
  KEY is what precedes the first of "<>=!", the operator the run of those characters, matched
  with strncmp against, in this order, "=", "!=", "<", "<=", ">", ">=" (so "==" and "<>" match
  none, and a lone "!" reads as "!="); an empty value, an unmatched operator, a key other than
  the four (compared case-insensitively) or a rule's -1 is "invalid expression", which refuses
  the container too. ``dsl_compare_version``: both sides only digits and dots, else invalid;
  numbers compared left to right, the first difference decides; a remainder of dots and zeros
  counts as nothing (12.4 == 12.4.0). ``dsl_compare_string``: = and != only, case-insensitive
  (str_case_equal); any other operator is invalid.

Which CUDA version a driver supports: ``DRIVER_BRANCHES`` below, from NVIDIA's CUDA Toolkit
Release Notes, "CUDA Toolkit and Corresponding Driver Versions" (docs.nvidia.com/cuda/
cuda-toolkit-release-notes, the Linux x86_64 column: the first driver of each CUDA GA): a driver
reports the CUDA version of the toolkit its branch shipped with. R565, which no toolkit shipped
with, reports CUDA 12.7 (its 565.57.01 release); CUDA 13.1 came with R590, 13.2 with R595.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# driver branch -> (the first Linux x86_64 driver of the CUDA release the branch supports, that CUDA)
DRIVER_BRANCHES = {
    450: ("450.51.05", "11.0"),
    455: ("455.23", "11.1"),
    460: ("460.27.03", "11.2"),
    465: ("465.19.01", "11.3"),
    470: ("470.42.01", "11.4"),
    495: ("495.29.05", "11.5"),
    510: ("510.39.01", "11.6"),
    515: ("515.43.04", "11.7"),
    520: ("520.61.05", "11.8"),
    525: ("525.60.13", "12.0"),
    530: ("530.30.02", "12.1"),
    535: ("535.54.03", "12.2"),
    545: ("545.23.06", "12.3"),
    550: ("550.54.14", "12.4"),
    555: ("555.42.02", "12.5"),
    560: ("560.28.03", "12.6"),
    565: ("565.57.01", "12.7"),
    570: ("570.26", "12.8"),
    575: ("575.51.03", "12.9"),
    580: ("580.65.06", "13.0"),
    590: ("590.44.01", "13.1"),
    595: ("595.45.04", "13.2"),
}
# What libnvidia-container's driver.c calls the brands forward compatibility supports (data-center
# GPUs; "Unknown" is NVML_BRAND_NVIDIA there) and the consumer brands it does not.
DATA_CENTER_BRANDS = ("Tesla", "Unknown")
CONSUMER_BRANDS = ("GeForce", "TITAN")
REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")  # dsl.c's table, in its order
_UINTMAX = 2**64 - 1
_EXPR_MAX = 128  # dsl.c's buffer for the failed condition's text
_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # strconv.ParseBool's true
_SEMVER = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[-+].*)?$")


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def branch_of(driver: str) -> int:
    """550 for 550.54.15."""
    return version_tuple(driver)[0]


def cuda_of(driver: str) -> str | None:
    """The CUDA version ``driver`` supports (what the runtime's ``cuda`` key reads): its branch's,
    or the newest known branch's below it; None for a branch newer than the table (unknown), 0.0
    for one older than it (older than any CUDA an image asks for)."""
    branch = branch_of(driver)
    if branch > max(DRIVER_BRANCHES):
        return None
    known = [b for b in DRIVER_BRANCHES if b <= branch]
    return DRIVER_BRANCHES[max(known)][1] if known else "0.0"


def first_driver_for(cuda: str) -> str | None:
    """The oldest driver that supports CUDA ``cuda`` (MAJOR.MINOR) natively: the first driver of
    the first branch whose CUDA is not older; None when the table has none yet."""
    want = version_tuple(cuda)[:2]
    for branch in sorted(DRIVER_BRANCHES):
        first, supports = DRIVER_BRANCHES[branch]
        if version_tuple(supports) >= want:
            return first
    return None


@dataclass(frozen=True)
class Device:
    """One visible GPU as the runtime reads it: ``brand`` as driver.c names it, ``arch`` its compute
    capability; None where unknown (the rule is then satisfied, as for a missing value there)."""

    brand: str | None = None
    arch: str | None = None


@dataclass(frozen=True)
class Host:
    """The node: the driver's version, the CUDA version it supports (None: from DRIVER_BRANCHES),
    the visible GPUs (none: the requirements are evaluated once without a device)."""

    driver: str | None
    cuda: str | None = None
    devices: tuple[Device, ...] = ()

    @classmethod
    def of(cls, driver: str, brand: str | None = None, arch: str | None = None, gpus: int = 1) -> Host:
        return cls(driver, cuda_of(driver), tuple(Device(brand, arch) for _ in range(gpus if brand or arch else 0)))

    def cuda_version(self) -> str | None:
        return self.cuda if self.cuda is not None or self.driver is None else cuda_of(self.driver)


@dataclass(frozen=True)
class Verdict:
    """Whether the container starts; ``message`` is what nvidia-container-cli says when it does
    not ("requirement error: ..."), or why nothing was checked."""

    starts: bool
    message: str = ""


class _Invalid(Exception):
    pass


def _strtoumax(s: str) -> tuple[int, str]:
    m = re.match(r"\d+", s)
    if m is None:
        raise _Invalid
    n = int(m.group(0))
    if n >= _UINTMAX:
        raise _Invalid
    return n, s[m.end() :]


def compare_version(v1: str, op: str, v2: str) -> bool:
    """dsl.c's dsl_compare_version(v1, op, v2); raises _Invalid where it returns -1."""
    if any(c not in "0123456789." for c in v1 + v2):
        raise _Invalid
    while v1 and v2:
        n1, rest1 = _strtoumax(v1)
        n2, rest2 = _strtoumax(v2)
        if n1 != n2:
            if op == "=":
                return False
            if op == "!=":
                return True
            return n1 < n2 if op in ("<", "<=") else n1 > n2
        v1, v2 = rest1.lstrip("."), rest2.lstrip(".")
    v1, v2 = v1.lstrip(".0"), v2.lstrip(".0")
    if op == "!=":
        return bool(v1 or v2)
    if op in ("=", "<=", ">=") and not v1 and not v2:
        return True
    if op == "=":
        return False
    return (not v1 and bool(v2)) if op in ("<", "<=") else (bool(v1) and not v2)


def _compare_string(s1: str, op: str, s2: str) -> bool:
    if op not in ("=", "!="):
        raise _Invalid
    return (s1.lower() == s2.lower()) == (op == "=")


def _rule(key: str, op: str, value: str, host: Host, dev: Device | None) -> bool:
    """configure.c's check_cuda_version / check_driver_version / check_device_arch / check_device_brand."""
    name = key.lower()
    if name == "cuda":
        have = host.cuda_version()
        return True if have is None else compare_version(have, op, value)
    if name == "driver":
        return True if host.driver is None else compare_version(host.driver, op, value)
    if name == "arch":
        return True if dev is None or dev.arch is None else compare_version(dev.arch, op, value)
    if name == "brand":
        return True if dev is None or dev.brand is None else _compare_string(dev.brand, op, value)
    raise _Invalid


def _condition(expr: str, host: Host, dev: Device | None) -> bool:
    """dsl.c's evaluate_rule: KEY OP VALUE."""
    n = next((i for i, c in enumerate(expr) if c in "<>=!"), len(expr))  # strcspn
    end = next((i for i in range(n, len(expr)) if expr[i] not in "<>=!"), len(expr))  # strspn
    key, run, value = expr[:n], expr[n:end], expr[end:]
    if not key or not run:
        raise _Invalid
    op = next((o for o in _OPERATORS if o.startswith(run)), None)  # strncmp(ptr, o, len(run)) == 0
    if op is None or not value:
        raise _Invalid
    held = _rule(key, op, value, host, dev)
    if not held and len(f"{key} {op} {value}") >= _EXPR_MAX:  # the message buffer overflows: -1
        raise _Invalid
    return held


def _evaluate_one(predicate: str, host: Host, dev: Device | None) -> str:
    """dsl.c's dsl_evaluate for one device: '' when satisfied, else the error it sets."""
    ret = True
    try:
        for alternative in predicate.split(" "):
            if not alternative:
                continue
            held = True  # all of this alternative's conditions (the empty ones are skipped)
            for condition in alternative.split(","):
                if not condition:
                    continue
                ret = _condition(condition, host, dev)
                if not ret:
                    held = False
                    break
            if held:
                break
    except _Invalid:
        return "invalid expression"
    if ret:
        return ""
    first = predicate.split(" ")[0]
    if first.startswith("cuda>="):
        return f"unsatisfied condition: {first}, please update your driver to a newer version, or use an earlier cuda container"
    return f"unsatisfied condition: {first}"


def evaluate(predicate: str, host: Host) -> Verdict:
    """One requirement (``--require=EXPR``) against every visible GPU of ``host``, or once
    without a device when none is visible (configure.c)."""
    for dev in host.devices or (None,):
        error = _evaluate_one(predicate, host, dev)
        if error:
            return Verdict(False, f"requirement error: {error}")
    return Verdict(True)


def requirements(env: Mapping[str, str]) -> list[str] | Verdict:
    """The ``--require`` expressions the toolkit passes for a container environment ``env``
    (sorted by name; the Go map's order is random, the outcome the same), or the Verdict that
    ends it before any is evaluated (checks disabled; an unparsable legacy CUDA_VERSION)."""
    if env.get("NVIDIA_DISABLE_REQUIRE", "") in _TRUE:
        return Verdict(True, f"NVIDIA_DISABLE_REQUIRE={env['NVIDIA_DISABLE_REQUIRE']}: requirements not checked")
    out = [env[k] for k in sorted(env) if k.startswith(REQUIRE_PREFIX) and not k.startswith(REQUIRE_PREFIX + "JETPACK")]
    legacy = env.get("CUDA_VERSION", "")
    if legacy and not env.get(REQUIRE_PREFIX + "CUDA", ""):
        m = _SEMVER.match(legacy)
        if m is None:
            return Verdict(False, f"failed to get requirements: invalid CUDA version {legacy}")
        out.append(f"cuda>={int(m.group(1))}.{int(m.group(2) or 0)}")
    return out


def admits(env: Mapping[str, str], host: Host) -> Verdict:
    """Whether the NVIDIA container runtime starts a container with environment ``env`` on
    ``host``: every requirement must hold (the first that does not is the message)."""
    reqs = requirements(env)
    if isinstance(reqs, Verdict):
        return reqs
    for predicate in reqs:
        verdict = evaluate(predicate, host)
        if not verdict.starts:
            return verdict
    return Verdict(True)


@dataclass(frozen=True)
class ForwardCompat:
    """The alternatives ``brand=B,driver>=N,driver<N+1`` of a requirement (nvidia/cuda's form):
    the driver branches, and for which brands, it admits through forward compatibility."""

    branches: tuple[int, ...]
    brands: tuple[str, ...]


def forward_compat(predicate: str) -> ForwardCompat:
    branches: set[int] = set()
    brands: set[str] = set()
    for alternative in predicate.split(" "):
        conditions = [c for c in alternative.split(",") if c]
        low = [c[len("driver>=") :] for c in conditions if c.lower().startswith("driver>=")]
        brand = [c[len("brand=") :] for c in conditions if c.lower().startswith("brand=")]
        if low and brand and all(re.fullmatch(r"\d+(\.\d+)*", v) for v in low):
            branches.add(branch_of(low[0]))
            brands.add(brand[0].lower())
    return ForwardCompat(tuple(sorted(branches)), tuple(sorted(brands)))


def branch_driver(branch: int) -> str:
    """A driver of ``branch`` to evaluate with: its table entry's, else BRANCH.0."""
    return DRIVER_BRANCHES[branch][0] if branch in DRIVER_BRANCHES else f"{branch}.0"
