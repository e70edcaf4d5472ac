"""Which checks run, on which image, in which order, and which are skipped before any container
starts: the ``image`` parameter from the options, --derived-tiers, the checks grouped by image,
each check's one tier and one evidence kind, and the tiers this host cannot run. Also what a
collected item is called in the results (its image, module and check)."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from trainbase_common.states import build_report

from . import EVIDENCE, TIERS, session
from .containers import short_name
from .options import image_refs
from .results import VERDICT_MODULE

DERIVED_NOTE = pytest.StashKey[str]()
_MISSING_HARDWARE = pytest.StashKey[str]()


# --------------------------------------------------------------------------- the images


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "image" not in metafunc.fixturenames:
        return
    refs = image_refs(metafunc.config)
    if refs:
        metafunc.parametrize("image", refs, ids=[short_name(r) for r in refs], scope="session")
    else:
        no_image = pytest.mark.skip(reason="no image given: pass --image REF or --report BUILD.json")
        metafunc.parametrize("image", [pytest.param(None, marks=no_image)], ids=["no-image"], scope="session")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The self-test builds images and re-runs this suite: only when asked for by name.
    if collection_path.name == "test_broken_variants.py":
        named = any(Path(a.split("::")[0]).resolve() == collection_path.resolve() for a in config.args)
        return None if (named or config.getoption("--broken-variants")) else True
    return None


# --------------------------------------------------------------------------- selection and order


@pytest.hookimpl(hookwrapper=True)  # around every other plugin's: -k, -m and pytest's reordering by fixture
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    """--derived-tiers, the checks grouped by image, each image's verdict last of its checks
    (whatever -k or -m selected: keep_verdicts); each check has one tier, and one this host
    cannot run is skipped here, with the reason, before any container starts."""
    verdicts = [i for i in items if module_name(i) == VERDICT_MODULE]
    items[:] = [i for i in items if module_name(i) != VERDICT_MODULE]
    yield
    deselect_derived_tiers(config, items, image_refs(config))
    group_by_image(items)
    keep_verdicts(config, items, verdicts)
    for item in items:
        if "image" not in getattr(item, "fixturenames", ()):
            continue
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            raise pytest.UsageError(
                f"{item.nodeid}: a conformance test needs exactly one tier marker "
                f"({', '.join(TIERS)}), found {tiers or 'none'}"
            )
        kinds = [m.args[0] if m.args else None for m in item.iter_markers("evidence")]
        if len(kinds) != 1 or kinds[0] not in EVIDENCE:
            raise pytest.UsageError(
                f"{item.nodeid}: a conformance test needs exactly one "
                f"@pytest.mark.evidence(KIND), KIND in {', '.join(EVIDENCE)}; "
                f"found {kinds}"
            )
        session.results(config).evidence[(module_name(item), check_name(item))] = kinds[0]
        _skip_without_hardware(config, item, tiers[0])


def keep_verdicts(config: pytest.Config, items: list[pytest.Item], verdicts: list[pytest.Item]) -> None:
    """Each image's verdict (checks/test_verdict.py) right after the last of its selected checks,
    whatever -k, -m or --derived-tiers left out: a selection cannot drop the check that says
    whether anything was checked. The verdict of an image none of whose checks is selected is
    deselected with them (no check of it runs: pytest's own "no tests ran" then, exit 5)."""
    last: dict[str | None, int] = {}
    for n, item in enumerate(items):
        if "image" in getattr(item, "fixturenames", ()):
            last[image_ref(item)] = n
    placed = sorted(((last[image_ref(v)], v) for v in verdicts if image_ref(v) in last), key=lambda nv: -nv[0])
    for n, v in placed:  # from the end, so the positions before stay right
        items.insert(n + 1, v)
    dropped = [v for v in verdicts if image_ref(v) not in last]
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def _skip_without_hardware(config: pytest.Config, item: pytest.Item, tier: str) -> None:
    """The gpu and fabric tiers on a host without a GPU / RDMA device: skipped with the reason,
    or (--require-hardware) failed with it at setup (pytest_runtest_setup)."""
    if tier not in ("gpu", "fabric"):
        return
    caps = session.host_caps(config)
    if tier == "gpu" and not caps.gpu:
        missing = f"tier gpu: no usable GPU on this host ({caps.gpu_why})"
    elif tier == "fabric" and not caps.ib:
        missing = f"tier fabric: no RDMA device on this host ({caps.ib_why})"
    else:
        return
    if config.getoption("--require-hardware"):
        item.stash[_MISSING_HARDWARE] = missing
    else:
        item.add_marker(pytest.mark.skip(reason=missing))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _MISSING_HARDWARE in item.stash:
        pytest.fail(f"{item.stash[_MISSING_HARDWARE]}; --require-hardware makes that a failure", pytrace=False)


def _derived_images(config: pytest.Config, refs: list[str]) -> dict[str, str]:
    """ref -> its parent's ref, for the --report images whose parent image is tested too."""
    cells = [c for path in config.getoption("--report") or [] for c in build_report(path)["cells"]]
    tested = set(refs)
    by_name = {c["name"]: c["image"] for c in cells if c.get("image") in tested}
    # keyed by short_name: what a test's "image" parameter holds once the suite has named it
    return {
        short_name(c["image"]): by_name[c["parent"]]
        for c in cells
        if c.get("image") in tested and c.get("parent") in by_name
    }


def deselect_derived_tiers(config: pytest.Config, items: list[pytest.Item], refs: list[str]) -> None:
    """--derived-tiers: a framework image shares its parent's MPI, fabric and launch layers, and
    the runtime tier (Podman, Charliecloud, Apptainer and enroot conversions of a 7 GB image) is
    where its time goes; CI can run those tiers on the parent only. Deselected, never passed."""
    wanted = config.getoption("--derived-tiers")
    if not wanted:
        return
    keep_tiers = {t.strip() for t in wanted.split(",") if t.strip()}
    if unknown := keep_tiers - set(TIERS):
        raise pytest.UsageError(
            f"--derived-tiers: unknown tier(s) {', '.join(sorted(unknown))}; tiers are {', '.join(TIERS)}"
        )
    derived = _derived_images(config, refs)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        tier = next((t for t in TIERS if item.get_closest_marker(t)), None)
        ref = image_ref(item)
        derived_only = ref is not None and short_name(ref) in derived and tier not in keep_tiers
        (drop if derived_only else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        config.stash[DERIVED_NOTE] = (
            f"--derived-tiers {','.join(sorted(keep_tiers))}: {len(drop)} check(s) of "
            + ", ".join(sorted({short_name(image_ref(i) or "") for i in drop}))
            + " deselected; their tiers ran on the parent image(s) "
            + ", ".join(sorted({short_name(derived[short_name(image_ref(i) or "")]) for i in drop}))
        )


def group_by_image(items: list[pytest.Item]) -> None:
    """Run every check of one image before the next image's, module by module (a stable sort:
    within a module, pytest's own order stays). pytest keeps one value of a session-scoped
    parameter alive at a time, and its reordering interleaves the images wherever a test has
    parameters of its own (the runtime ways, the PMI kinds): measured on the ci profile's three
    images, the image's container started 68 times, the two-node cluster 41, the Charliecloud
    unpack 19 and the rootless Podman load 6 -- about a third of the suite's time spent
    starting things again."""
    images: dict[str | None, int] = {}  # None: a check with no image parameter
    modules: dict[str, int] = {}
    for item in items:
        images.setdefault(image_ref(item), len(images))
        modules.setdefault(item.nodeid.split("::")[0], len(modules))
    items.sort(key=lambda it: (images[image_ref(it)], modules[it.nodeid.split("::")[0]]))


# --------------------------------------------------------------------------- what an item is called


def image_ref(item: pytest.Item) -> str | None:
    """The image reference the item is parametrized with; None for a check with no image (or
    the "no image given" placeholder)."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("image") if callspec else None


def check_name(item: pytest.Item) -> str:
    """The test name without the image parameter (other parameters kept): a row of the matrix."""
    cs = getattr(item, "callspec", None)
    other = {k: v for k, v in cs.params.items() if k != "image"} if cs is not None else {}
    if not other:
        return getattr(item, "originalname", item.name)
    return f"{getattr(item, 'originalname', item.name)}[{'-'.join(str(v) for v in other.values())}]"


def module_name(item: pytest.Item) -> str:
    """The check module's short name (test_nccl); "" for an item no Python module collected."""
    module = getattr(item, "module", None)
    return module.__name__.rsplit(".", 1)[-1] if module else ""
