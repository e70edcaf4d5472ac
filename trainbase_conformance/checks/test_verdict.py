"""The verdict on each image: the run checked it against what it claims. pytest's own rule -- a
run that collected nothing exits 5, never 0 -- made finer, since the suite knows which checks
apply to what was declared:

* no check ran against the image (every one skipped: components the expectations file does
  not declare and the image does not hold, checks that do not apply, hardware this host
  lacks, a selection of nothing that applies) fails, naming why and what to declare;
* on an image trainbase did not build, only the checks that need no declaration (hygiene,
  integrity, the declared Python) ran, the file declaring nothing but ``python`` and the image
  holding none of what a training image is made of (MPI, NCCL, CUDA, cuDNN, UCX, the
  InfiniBand userspace, a framework): fails, saying what to declare;
* an expectations file given beside the image's own manifest claims something the manifest
  does not (expectations.disagreements): fails, naming each claim -- the file is never
  silently dropped.

It runs after every other check of its image, whatever -k or -m selected
(collection.keep_verdicts), and judges what the run recorded for them (results.Results.tally:
the same counts the summary prints)."""

from __future__ import annotations

import pytest

from trainbase_conformance import session
from trainbase_conformance.expectations import COMPONENTS, FRAMEWORKS, example
from trainbase_conformance.results import Tally


def nothing_ran(image: str, t: Tally, source: str) -> str:
    """Why no check ran against ``image``, and what would make some run, in one line."""
    parts = []
    if t.undeclared:
        wanted = sorted(t.undeclared, key=lambda k: -t.undeclared[k])
        parts.append(
            f"{t.not_declared} because {source} declares no {', '.join(repr(k) for k in wanted)} and the image "
            f"holds none (declare what it holds: {'; '.join(f'`{example(k)}`' for k in wanted[:3])})"
        )
    if t.other:
        parts.append(f"{len(t.other)} not applicable (e.g. {t.other[0][:200]!r})")
    if t.errors:
        parts.append(f"{t.error} could not start (e.g. {t.errors[0].strip().splitlines()[0][:200]!r})")
    return f"no check ran against {image}: " + ("; ".join(parts) or "none was selected") + "; nothing was checked"


def declares_nothing(image: str, source: str) -> str:
    """The run on ``image`` checked only what needs no declaration, in one line."""
    held = ", ".join(c.what for c in COMPONENTS.values()) + " or a framework (" + ", ".join(FRAMEWORKS) + ")"
    return (
        f"only the checks that need no declaration (hygiene, integrity, the declared Python) ran against {image}: "
        f"{source} declares nothing but 'python' and the image holds none of {held}: nothing a training image is "
        f"made of was checked; declare what the image claims to hold in {source} (`{example('mpi')}`, "
        f"`{example('nccl')}`, ...)"
    )


def what_it_claims(target) -> list[str]:
    """What the image claims or holds beside its Python: the components and frameworks it
    declares, and those found in it undeclared (COMPONENTS, FRAMEWORKS)."""
    declared = [k for k in dict(target.components) if k != "python"]
    declared += [f"frameworks.{fw}" for fw in target.manifest.get("frameworks") or {}]
    held = [k for k in [*COMPONENTS, *(f"frameworks.{fw}" for fw in FRAMEWORKS)] if target.holds(k)]
    return sorted(set(declared + held))


@pytest.mark.static
@pytest.mark.evidence("content")
def test_the_image_was_checked_against_its_claims(image, request):
    """Some check ran against the image, what it was checked against is more than its Python
    (an expectations file that declares nothing else, on an image that holds nothing else, is
    checked for hygiene only), and an expectations file given beside its own manifest agrees
    with it."""
    t = session.results(request.config).tally(image)
    expect = request.config.getoption("--expect")
    source = expect.rsplit("/", 1)[-1] if expect else "the manifest"
    assert t.ran, nothing_ran(image, t, source)
    target = request.getfixturevalue("target")
    assert not target.disagreements, (
        f"{source} and {image}'s own manifest disagree (both are claims about the image; the checks read the "
        f"manifest): " + "; ".join(target.disagreements)
    )
    if target.foreign:
        assert what_it_claims(target), declares_nothing(image, target.components_source)
