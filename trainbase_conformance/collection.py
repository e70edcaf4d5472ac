"""The order and the selection of the conformance checks, decided at collection (plugin.py's
pytest_collection_modifyitems): checks grouped by image, and --derived-tiers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import TIERS
from .containers import short_name

DERIVED_NOTE = pytest.StashKey[str]()


def _derived_images(config: pytest.Config, refs: list[str]) -> dict[str, str]:
    """ref -> its parent's ref, for the --report images whose parent image is tested too."""
    cells = [c for path in config.getoption("--report") or []
             for c in json.loads(Path(path).read_text()).get("cells", [])]
    tested = set(refs)
    by_name = {c["name"]: c["image"] for c in cells if c.get("image") in tested}
    # keyed by short_name: what a test's "image" parameter holds once the suite has named it
    return {short_name(c["image"]): by_name[c["parent"]] for c in cells
            if c.get("image") in tested and c.get("parent") in by_name}


def deselect_derived_tiers(config: pytest.Config, items: list[pytest.Item], refs: list[str]) -> None:
    """--derived-tiers: a framework image shares its parent's MPI, fabric and launch layers, and
    the runtime tier (Podman, Charliecloud, Apptainer and enroot conversions of a 7 GB image) is
    where its time goes; CI can run those tiers on the parent only. Deselected, never passed."""
    wanted = config.getoption("--derived-tiers")
    if not wanted:
        return
    keep_tiers = {t.strip() for t in wanted.split(",") if t.strip()}
    if unknown := keep_tiers - set(TIERS):
        raise pytest.UsageError(f"--derived-tiers: unknown tier(s) {', '.join(sorted(unknown))}; "
                                f"tiers are {', '.join(TIERS)}")
    derived = _derived_images(config, refs)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        tier = next((t for t in TIERS if item.get_closest_marker(t)), None)
        ref = _image_param(item)
        (drop if ref is not None and short_name(ref) in derived and tier not in keep_tiers else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        config.stash[DERIVED_NOTE] = (
            f"--derived-tiers {','.join(sorted(keep_tiers))}: {len(drop)} check(s) of "
            + ", ".join(sorted({short_name(_image_param(i) or "") for i in drop}))
            + " deselected; their tiers ran on the parent image(s) "
            + ", ".join(sorted({short_name(derived[short_name(_image_param(i) or "")]) for i in drop})))


def group_by_image(items: list[pytest.Item]) -> None:
    """Run every check of one image before the next image's, module by module (a stable sort:
    within a module, pytest's own order stays). pytest keeps one value of a session-scoped parameter alive at a
    time, and its reordering interleaves the images wherever a test has parameters of its own
    (the runtime ways, the PMI kinds): measured on the ci profile's three images, the image's
    container started 68 times, the two-node cluster 41, the Charliecloud unpack 19 and the
    rootless Podman load 6 -- about a third of the suite's time spent starting things again."""
    images: dict[str | None, int] = {}      # None: a check with no image parameter
    modules: dict[str, int] = {}
    for item in items:
        images.setdefault(_image_param(item), len(images))
        modules.setdefault(item.nodeid.split("::")[0], len(modules))
    items.sort(key=lambda it: (images[_image_param(it)], modules[it.nodeid.split("::")[0]]))


def _image_param(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("image") if callspec else None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The self-test builds images and re-runs this suite: only when asked for by name.
    if collection_path.name == "test_broken_variants.py":
        named = any(Path(a.split("::")[0]).resolve() == collection_path.resolve() for a in config.args)
        return None if (named or config.getoption("--broken-variants")) else True
    return None
