"""The docs' sentences that send a driver branch to an image agree with the image's own promise
(trainbase_common.driver_promise: its CUDA natively, or the branches its nvidia/cuda base admits
through forward compatibility on data-center GPUs), evaluated from the rendered manifest (issue 73).

The claims read, in README.md and the pages that route nodes to images:
- "on R535 or R550 takes the CUDA 12.8 Ubuntu sibling" -- the sibling of that CUDA and OS among
  the images the same paragraph names; without a CUDA, every such sibling must admit them;
- "(R535, R550, R570: ...) -> `IMAGE`" -- the branches in the parenthesis before an arrow;
- "`IMAGE` (R580 and R590 through forward compatibility)" -- the branches right after an image.
README's sentence as it stood at 591e86f sent an R550 node to the CUDA 13.2 sibling, which its
base refuses there (13.2's branches are R535/R570/R580/R590): the checker finds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainbase.define import base_lock
from trainbase.render import catalogue
from trainbase_common.driver_promise import DriverPromise

from .conftest import ROOT

PAGES = ["README.md", "docs/choose.md", "docs/azureml.md", "docs/llm-stack.md"]
IMAGE = r"`([a-z0-9.-]+-cuda\d+\.\d+-cudnn\d+-[a-z0-9.]+(?:-arm64)?)`"
BRANCH = re.compile(r"R(\d{3})")
SIBLING = re.compile(r"on ((?:R\d{3}(?:, | or | and )?)+) takes the (?:CUDA (\d+\.\d+) )?(Ubuntu|Debian) sibling")
BEFORE_ARROW = re.compile(r"\(((?:R\d{3}(?:, | or | and )?)+)[^)]*\)\s*(?:→|->)\s*" + IMAGE)
AFTER_IMAGE = re.compile(IMAGE + r"\s*\(((?:R\d{3}(?:, | or | and )?)+) through forward")


def promise(image: str) -> DriverPromise:
    # the catalogue's own evaluation (its driver column), with the base locks' recorded Env
    manifest = json.loads((ROOT / "images" / image / "manifest.json").read_text())
    return catalogue.promise_of(manifest, base_lock.load(ROOT))


def admits(p: DriverPromise, branch: int) -> bool:
    """Whether an image of promise ``p`` starts on a data-center GPU under driver branch ``branch``."""
    native = int(p.native.split(".")[0]) if p.native else None
    return branch in p.forward_compat or (native is not None and branch >= native)


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text joined onto one line) of each blank-line- or bullet-separated paragraph."""
    out, start, buf = [], 1, []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or re.match(r"\s*[-*] |\s*\d+\. ", line):
            if buf:
                out.append((start, " ".join(buf)))
            buf, start = ([line.strip()] if line.strip() else []), n
        else:
            buf.append(line.strip())
    if buf:
        out.append((start, " ".join(buf)))
    return out


def problems(page: str, text: str) -> list[str]:
    out = []
    for line, para in paragraphs(text):
        named = re.findall(IMAGE, para)
        claims: list[tuple[list[str], list[int]]] = []
        for m in SIBLING.finditer(para):
            cuda, os_name = m.group(2), m.group(3).lower()
            siblings = [i for i in named if os_name in i and (cuda is None or f"-cuda{cuda}-" in i)]
            if not siblings:
                out.append(f"{page}:{line}: {m.group(0)!r} names no {os_name} image of that CUDA in its paragraph")
            claims.append((siblings, [int(b) for b in BRANCH.findall(m.group(1))]))
        for m in BEFORE_ARROW.finditer(para):
            claims.append(([m.group(2)], [int(b) for b in BRANCH.findall(m.group(1))]))
        for m in AFTER_IMAGE.finditer(para):
            claims.append(([m.group(1)], [int(b) for b in BRANCH.findall(m.group(2))]))
        for images, branches in claims:
            for image in images:
                if not (ROOT / "images" / image / "manifest.json").is_file():
                    out.append(f"{page}:{line}: {image} is no rendered cell")
                    continue
                p = promise(image)
                refused = [f"R{b}" for b in branches if not admits(p, b)]
                if refused:
                    out.append(f"{page}:{line}: sends {', '.join(refused)} to {image}, which starts on {p.text()}")
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_branch_the_docs_send_to_an_image_is_one_it_starts_on(page):
    assert not problems(page, (ROOT / page).read_text())


def test_the_readme_sentence_of_591e86f_is_caught():
    old = (
        "- **Azure ML on ND H100 v5 with PyTorch**: `pytorch2.10.0-openmpi4.1.4-cuda12.8-cudnn9-debian12`\n"
        "  (node driver 570 to 594); an H100 node on R535 or R550 takes the Ubuntu sibling below. Their\n"
        "  Ubuntu 24.04 / conda siblings, `pytorch2.10.0-openmpi4.1.8-cuda12.8-cudnn9-ubuntu24.04` and\n"
        "  `pytorch2.15.0-openmpi4.1.8-cuda13.2-cudnn9-ubuntu24.04`, are not built by this project yet\n"
    )
    [found] = problems("README.md", old)
    assert (
        "sends R550 to pytorch2.15.0-openmpi4.1.8-cuda13.2-cudnn9-ubuntu24.04, which starts on 595.45.04+, or R535/R570/R580/R590"
        in found
    )


def test_the_other_two_forms_are_read():
    text = (
        "- driver below 580 (R535, R550, R570: data-center) → `pytorch2.15.0-openmpi4.1.8-cuda13.2-cudnn9-ubuntu24.04`;\n"
        "  or `pytorch2.15.0-openmpi4.1.8-cuda13.2-cudnn9-ubuntu24.04` (R575 and R580 through forward compatibility)\n"
    )
    found = problems("docs/choose.md", text)
    assert [f.split(" sends ")[1].split(" to ")[0] for f in found] == ["R550", "R575"], found


def test_a_page_names_a_sibling_it_does_not_show():
    assert problems(
        "x.md", "an H100 node on R535 takes the CUDA 12.9 Ubuntu sibling. `a-cuda12.8-cudnn9-ubuntu24.04`"
    ) == ["x.md:1: 'on R535 takes the CUDA 12.9 Ubuntu sibling' names no ubuntu image of that CUDA in its paragraph"]


def test_paths_resolve():
    assert all((ROOT / p).is_file() for p in PAGES) and Path(ROOT / "images").is_dir()
