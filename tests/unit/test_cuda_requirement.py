"""The container runtime's requirement check (trainbase_common.cuda_requirement): libnvidia-container's
grammar and rules, quirks included, the driver-branch table, and the in-image doctor's copy of it."""

from __future__ import annotations

import pytest

from trainbase_common import cuda_requirement as cr
from trainbase_common.cuda_requirement import Device, Host, admits, evaluate
from trainbase_common.driver_promise import NVIDIA_CUDA_BASES, nvidia_require_cuda

from .conftest import ROOT

DOCTOR_COPY = ROOT / "imagefs" / "opt" / "trainbase" / "lib" / "trainbase_doctor" / "cuda_requirement.py"
# NVIDIA_REQUIRE_CUDA of nvidia/cuda:12.8.1-base-ubuntu24.04, as NVIDIA's Dockerfile sets it
# (gitlab.com/nvidia/container-images/cuda dist/12.8.1/ubuntu2404/base/Dockerfile, amd64 and arm64
# alike), one space-separated alternative after another
NVIDIA_12_8_1 = " ".join(
    line.strip()
    for line in """
    cuda>=12.8 brand=unknown,driver>=470,driver<471 brand=grid,driver>=470,driver<471
    brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471
    brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471
    brand=nvidiartx,driver>=470,driver<471 brand=vapps,driver>=470,driver<471
    brand=vpc,driver>=470,driver<471 brand=vcs,driver>=470,driver<471
    brand=vws,driver>=470,driver<471 brand=cloudgaming,driver>=470,driver<471
    brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536
    brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536
    brand=quadro,driver>=535,driver<536 brand=quadrortx,driver>=535,driver<536
    brand=nvidiartx,driver>=535,driver<536 brand=vapps,driver>=535,driver<536
    brand=vpc,driver>=535,driver<536 brand=vcs,driver>=535,driver<536
    brand=vws,driver>=535,driver<536 brand=cloudgaming,driver>=535,driver<536
    brand=unknown,driver>=550,driver<551 brand=grid,driver>=550,driver<551
    brand=tesla,driver>=550,driver<551 brand=nvidia,driver>=550,driver<551
    brand=quadro,driver>=550,driver<551 brand=quadrortx,driver>=550,driver<551
    brand=nvidiartx,driver>=550,driver<551 brand=vapps,driver>=550,driver<551
    brand=vpc,driver>=550,driver<551 brand=vcs,driver>=550,driver<551
    brand=vws,driver>=550,driver<551 brand=cloudgaming,driver>=550,driver<551
    brand=unknown,driver>=560,driver<561 brand=grid,driver>=560,driver<561
    brand=tesla,driver>=560,driver<561 brand=nvidia,driver>=560,driver<561
    brand=quadro,driver>=560,driver<561 brand=quadrortx,driver>=560,driver<561
    brand=nvidiartx,driver>=560,driver<561 brand=vapps,driver>=560,driver<561
    brand=vpc,driver>=560,driver<561 brand=vcs,driver>=560,driver<561
    brand=vws,driver>=560,driver<561 brand=cloudgaming,driver>=560,driver<561
    brand=unknown,driver>=565,driver<566 brand=grid,driver>=565,driver<566
    brand=tesla,driver>=565,driver<566 brand=nvidia,driver>=565,driver<566
    brand=quadro,driver>=565,driver<566 brand=quadrortx,driver>=565,driver<566
    brand=nvidiartx,driver>=565,driver<566 brand=vapps,driver>=565,driver<566
    brand=vpc,driver>=565,driver<566 brand=vcs,driver>=565,driver<566
    brand=vws,driver>=565,driver<566 brand=cloudgaming,driver>=565,driver<566
""".strip().splitlines()
)
H100, V100, RTX4090 = Device("Unknown", "9.0"), Device("Tesla", "7.0"), Device("GeForce", "8.9")


def on(driver: str, *devices: Device) -> Host:
    return Host(driver, cr.cuda_of(driver), devices)


def test_the_doctor_ships_this_very_module():
    """tb-doctor imports nothing outside /opt/trainbase/lib: its copy must be this file, byte for byte."""
    assert DOCTOR_COPY.read_bytes() == (ROOT / "trainbase_common" / "cuda_requirement.py").read_bytes(), (
        "copy trainbase_common/cuda_requirement.py over imagefs/opt/trainbase/lib/trainbase_doctor/cuda_requirement.py"
    )


def test_the_recorded_nvidia_base_requirement_is_nvidias_own_byte_for_byte():
    assert nvidia_require_cuda("12.8.1") == NVIDIA_12_8_1
    assert set(NVIDIA_CUDA_BASES) == {"12.8.1", "12.9.1", "13.0.1", "13.2.1"}


@pytest.mark.parametrize(
    "driver, device, starts",
    [
        ("570.86.15", H100, True),  # cuda 12.8 itself
        ("575.57.08", RTX4090, True),  # newer: any brand
        ("535.183.01", H100, True),  # brand=unknown,driver>=535,driver<536 (H100: NVML_BRAND_NVIDIA = "Unknown")
        ("535.183.01", V100, True),  # brand=tesla
        ("470.256.02", V100, True),
        ("550.163.01", H100, True),
        ("565.57.01", V100, True),
        ("535.183.01", RTX4090, False),  # no geforce alternative
        ("545.23.08", H100, False),  # a branch forward compatibility does not cover
        ("555.42.06", V100, False),
        ("465.19.01", V100, False),
        ("536.0", V100, False),  # driver<536
    ],
)
def test_nvidias_12_8_requirement_on_drivers_and_gpus(driver, device, starts):
    verdict = evaluate(NVIDIA_12_8_1, on(driver, device))
    assert verdict.starts is starts, verdict
    if not starts:
        assert verdict.message == (
            "requirement error: unsatisfied condition: cuda>=12.8, please update your driver to a newer version, "
            "or use an earlier cuda container"
        )


def test_cuda_alone_refuses_the_drivers_the_old_catalogue_promised():
    """What every image set before: cuda>=12.8 refuses R535 and R550 even on an H100, and a
    13.2 image's cuda>=13.2 refuses R580 (CUDA 13.0)."""
    assert not evaluate("cuda>=12.8", on("535.183.01", H100)).starts
    assert not evaluate("cuda>=12.8", on("550.163.01", H100)).starts
    assert not evaluate("cuda>=13.2", on("580.95.05", H100)).starts
    assert evaluate("cuda>=13.2", on("595.58.03", H100)).starts


@pytest.mark.parametrize(
    "expr, host, starts, message",
    [
        # alternatives by spaces (one suffices), conditions by commas (all must hold)
        ("cuda>=13.0 driver>=550,driver<551", on("550.54.15"), True, ""),
        ("cuda>=13.0 driver>=550,driver<551", on("560.35.03"), False, "unsatisfied condition: cuda>=13.0, please"),
        ("driver>=550,cuda>=12.4", on("550.54.15"), True, ""),
        ("driver>=550,cuda>=12.5", on("550.54.15"), False, "unsatisfied condition: driver>=550,cuda>=12.5"),
        # empty pieces are skipped; an empty requirement holds
        ("  cuda>=12.0  ,, ", on("550.54.15"), True, ""),
        ("", on("550.54.15"), True, ""),
        # ...but an alternative of commas only ends the search with the last verdict: false here
        ("cuda>=13.0 ,", on("550.54.15"), False, "unsatisfied condition: cuda>=13.0"),
        # operators: = != < <= > >=, matched by strncmp in that order
        ("cuda=12.4", on("550.54.15"), True, ""),
        ("cuda!=12.4", on("550.54.15"), False, "unsatisfied condition: cuda!=12.4"),
        ("cuda!12.4", on("550.54.15"), False, "unsatisfied condition: cuda!12.4"),  # a lone ! reads as !=
        ("cuda<12.5", on("550.54.15"), True, ""),
        ("cuda>12.4", on("550.54.15"), False, "unsatisfied condition: cuda>12.4"),
        ("cuda==12.4", on("550.54.15"), False, "invalid expression"),  # no operator is "=="
        ("cuda<>12.4", on("550.54.15"), False, "invalid expression"),
        ("cuda>=", on("550.54.15"), False, "invalid expression"),  # empty value
        (">=12.4", on("550.54.15"), False, "invalid expression"),  # no key
        ("cuda12.4", on("550.54.15"), False, "invalid expression"),  # no operator
        ("rocm>=6.0", on("550.54.15"), False, "invalid expression"),  # a key other than the four
        ("CUDA>=12.4", on("550.54.15"), True, ""),  # keys are case-insensitive
        ("cuda>=12.4a", on("550.54.15"), False, "invalid expression"),  # versions: digits and dots only
        # versions: left to right, a remainder of dots and zeros is nothing
        ("cuda>=12.4.0", on("550.54.15"), True, ""),
        ("cuda=12.4.0.0", on("550.54.15"), True, ""),
        ("cuda<12.4.1", on("550.54.15"), True, ""),
        ("driver>=550.100", on("550.54.15"), False, "unsatisfied condition: driver>=550.100"),
        # an invalid condition is reached only if the ones before it do not settle the verdict
        ("cuda>=12.0 rocm>=6", on("550.54.15"), True, ""),
        ("cuda>=13.0 rocm>=6", on("550.54.15"), False, "invalid expression"),
        # brand: = and != only, case-insensitive; arch as a version
        ("brand=TESLA", on("535.1", V100), True, ""),
        ("brand!=geforce", on("535.1", RTX4090), False, "unsatisfied condition: brand!=geforce"),
        ("brand<tesla", on("535.1", V100), False, "invalid expression"),
        ("arch>=8.0", on("535.1", H100), True, ""),
        ("arch>=8.0", on("535.1", V100), False, "unsatisfied condition: arch>=8.0"),
        # no visible device: brand and arch hold; every visible device must satisfy each requirement
        ("brand=tesla,arch>=9.0", on("535.1"), True, ""),
        ("arch>=8.0", on("535.1", H100, V100), False, "unsatisfied condition: arch>=8.0"),
        # a failed condition whose text does not fit dsl.c's 128-byte buffer is an invalid expression
        ("driver=" + "1." * 64 + "1", on("535.1"), False, "invalid expression"),
        ("driver=" + "1." * 10 + "1", on("535.1"), False, "unsatisfied condition: driver=1.1."),
    ],
)
def test_libnvidia_containers_grammar(expr, host, starts, message):
    verdict = evaluate(expr, host)
    assert verdict.starts is starts
    assert verdict.message.startswith(f"requirement error: {message}" if message else ""), verdict.message


@pytest.mark.parametrize(
    "env, starts, message",
    [
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, False, "unsatisfied condition: cuda>=12.8"),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "true"}, True, "requirements not checked"),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "1"}, True, "requirements not checked"),
        (
            {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "yes"},
            False,
            "unsatisfied",
        ),  # not ParseBool's
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "NVIDIA_DISABLE_REQUIRE": "false"}, False, "unsatisfied"),
        # every NVIDIA_REQUIRE_* counts, NVIDIA_REQUIRE_JETPACK* does not
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_DRIVER": "driver>=560"}, False, "driver>=560"),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_JETPACK": "csv-mounts=all"}, True, ""),
        # a legacy image (CUDA_VERSION, no NVIDIA_REQUIRE_CUDA) requires cuda>=MAJOR.MINOR of it
        ({"CUDA_VERSION": "12.8.1"}, False, "unsatisfied condition: cuda>=12.8"),
        ({"CUDA_VERSION": "12.2.0"}, True, ""),
        ({"CUDA_VERSION": "12.8.1", "NVIDIA_REQUIRE_CUDA": ""}, False, "cuda>=12.8"),  # set but empty: legacy too
        ({"CUDA_VERSION": "twelve"}, False, "failed to get requirements: invalid CUDA version twelve"),
        ({}, True, ""),
    ],
)
def test_the_toolkits_collection_of_requirements(env, starts, message):
    verdict = admits(env, on("550.163.01", H100))
    assert verdict.starts is starts
    assert message in verdict.message


def test_the_driver_branch_table():
    """Each branch supports a newer CUDA than the one before; a driver reads its branch's."""
    cudas = [cr.version_tuple(c) for _, (_, c) in sorted(cr.DRIVER_BRANCHES.items())]
    assert cudas == sorted(set(cudas))
    assert all(cr.branch_of(first) == b for b, (first, _) in cr.DRIVER_BRANCHES.items())
    assert [cr.cuda_of(d) for d in ("535.183.01", "550.54.15", "570.195.03", "580.95.05", "590.48.01")] == [
        "12.2",
        "12.4",
        "12.8",
        "13.0",
        "13.1",
    ]
    assert cr.cuda_of("999.1") is None and cr.cuda_of("440.33") == "0.0"
    assert [cr.first_driver_for(c) for c in ("12.8", "12.9", "13.0", "13.2")] == [
        "570.26",
        "575.51.03",
        "580.65.06",
        "595.45.04",
    ]
    assert cr.first_driver_for("14.0") is None


def test_forward_compat_alternatives():
    fc = cr.forward_compat(NVIDIA_12_8_1)
    assert fc.branches == (470, 535, 550, 560, 565)
    assert {"tesla", "unknown", "nvidia"} <= set(fc.brands) and "geforce" not in fc.brands
    assert cr.forward_compat("cuda>=12.8").branches == ()
