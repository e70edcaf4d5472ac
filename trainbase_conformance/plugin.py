"""The conformance suite's pytest plugin: which images, which containers, which tiers, which
reports. Installed, it is registered through the ``pytest11`` entry point and driven by the
``trainbase-conformance`` command (cli.py); in a checkout, pyproject.toml loads it with ``-p``:

    trainbase-conformance trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:latest --tier static,cpu
    pytest trainbase_conformance/checks --report reports/build-ci.json     # every built/cached image

Each test takes the session fixture ``target`` (one long-running container per image,
parametrized so test ids name the image) or ``cluster`` (two containers on a private
network with sshd) and checks one thing against the image's OWN manifest
(/etc/trainbase/manifest.json), or for an image trainbase did not build, against the
expectations file its user wrote (--expect, expectations.py): no test knows any image by name.

Tiers are markers, one per test; a tier this host cannot run is skipped with the reason, never passed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from trainbase_common import engine
from trainbase_common.emulation import EmulationError
from trainbase_common.states import usable_images

from . import EVIDENCE, MARKERS, TIERS, expectations
from .collection import DERIVED_NOTE, deselect_derived_tiers, group_by_image, pytest_ignore_collect  # noqa: F401
from .containers import Container, inspect_image, short_name, ssh_cluster
from .emulation import _native_only, emulated, ensure_emulator  # noqa: F401  (an autouse fixture, registered here)
from .flavors import MpiFlavor
from .host import HostCaps, probe_host
from .resources import DOCTOR_SCHEMA as DOCTOR_SCHEMA_PATH
from .resources import PROBES
from .results import Results

DOCTOR_SCHEMA = json.loads(DOCTOR_SCHEMA_PATH.read_text())
PROBE_DIR = "/tmp/tbconf"  # where the probes are copied in every container
_RESULTS = pytest.StashKey[Results]()
_CAPS = pytest.StashKey[HostCaps]()
_IMAGE_FACTS = pytest.StashKey[dict[str, dict[str, str]]]()
_MISSING_HARDWARE = pytest.StashKey[str]()


# --------------------------------------------------------------------------- options

def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("trainbase conformance")
    g.addoption("--image", action="append", default=[], metavar="REF",
                help="image to test (repeatable), e.g. trainbase/openmpi4.1.4-cuda12.8-cudnn9-debian12:latest")
    g.addoption("--report", action="append", default=[], metavar="BUILD.json",
                help="test every image with status built/cached in this build report (repeatable)")
    g.addoption("--expect", default=None, metavar="FILE",
                help="for an image without /etc/trainbase/manifest.json (not built by trainbase): what it "
                     "claims to hold, YAML/JSON following expectations.schema.json")
    g.addoption("--conformance-report", default="reports/conformance.md", metavar="PATH",
                help="Markdown summary (image x check); for JUnit use pytest's --junitxml")
    g.addoption("--shm-size", default="1g", help="--shm-size for every container (default 1g)")
    g.addoption("--require-hardware", action="store_true",
                help="the gpu and fabric tiers FAIL instead of skipping on a host without a GPU / RDMA "
                     "device: a GPU runner that lost its GPU must not pass")
    g.addoption("--derived-tiers", default=None, metavar="TIER,...",
                help="an image built FROM another one of this run (a framework on its base): only these "
                     "tiers; the others are deselected, as the summary says (default: all tiers)")
    g.addoption("--broken-variants", action="store_true",
                help="also collect test_broken_variants.py (the suite's self-test) in a directory run")


def _image_refs(config: pytest.Config) -> list[str]:
    refs: list[str] = list(config.getoption("--image") or [])
    for path in config.getoption("--report") or []:
        refs += usable_images(path)
    return list(dict.fromkeys(refs))


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_RESULTS] = Results()
    config.stash[_IMAGE_FACTS] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "image" not in metafunc.fixturenames:
        return
    refs = _image_refs(metafunc.config)
    if refs:
        metafunc.parametrize("image", refs, ids=[short_name(r) for r in refs], scope="session")
    else:
        metafunc.parametrize("image", [pytest.param(None, marks=pytest.mark.skip(
            reason="no image given: pass --image REF or --report BUILD.json"))], ids=["no-image"], scope="session")


@pytest.hookimpl(trylast=True)   # after pytest's own reordering by fixture, which group_by_image corrects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--derived-tiers, the checks grouped by image; each has one tier, and one this host cannot
    run is skipped here, with the reason, before any container starts."""
    deselect_derived_tiers(config, items, _image_refs(config))
    group_by_image(items)
    caps = None
    for item in items:
        if "image" not in getattr(item, "fixturenames", ()):
            continue
        tiers = [t for t in TIERS if item.get_closest_marker(t)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: a conformance test needs exactly one tier marker "
                                    f"({', '.join(TIERS)}), found {tiers or 'none'}")
        kinds = [m.args[0] if m.args else None for m in item.iter_markers("evidence")]
        if len(kinds) != 1 or kinds[0] not in EVIDENCE:
            raise pytest.UsageError(f"{item.nodeid}: a conformance test needs exactly one "
                                    f"@pytest.mark.evidence(KIND), KIND in {', '.join(EVIDENCE)}; found {kinds}")
        module = _module_name(item)
        config.stash[_RESULTS].evidence[(module, _check_name(item))] = kinds[0]
        if tiers[0] in ("gpu", "fabric"):
            caps = caps or _caps(config)
            missing = (f"tier gpu: no usable GPU on this host ({caps.gpu_why})" if tiers[0] == "gpu" and not caps.gpu
                       else f"tier fabric: no RDMA device on this host ({caps.ib_why})" if tiers[0] == "fabric"
                       and not caps.ib else "")
            if missing and config.getoption("--require-hardware"):
                item.stash[_MISSING_HARDWARE] = missing
            elif missing:
                item.add_marker(pytest.mark.skip(reason=missing))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _MISSING_HARDWARE in item.stash:
        pytest.fail(f"{item.stash[_MISSING_HARDWARE]}; --require-hardware makes that a failure", pytrace=False)


# --------------------------------------------------------------------------- host and tiers

@pytest.fixture(scope="session")
def host_caps(pytestconfig: pytest.Config, record_testsuite_property: Callable[[str, object], None]) -> HostCaps:
    caps = _caps(pytestconfig)
    for k, v in caps.describe().items():
        record_testsuite_property(f"host.{k}", v)
    return caps


def _caps(config: pytest.Config) -> HostCaps:
    if _CAPS not in config.stash:
        config.stash[_CAPS] = probe_host(shm_size=config.getoption("--shm-size"))
    return config.stash[_CAPS]


# --------------------------------------------------------------------------- the image under test

@dataclass
class Target:
    """One image, started once as a long-running container. ``host`` is testinfra's
    ``docker://`` host; ``sh``/``login`` run a command in a non-login ``/bin/sh -c`` (the
    image's ENV, what ``docker exec`` and testinfra see) or a login ``bash -lc`` shell."""

    ref: str
    inspect: dict[str, Any]
    manifest: dict[str, Any]
    container: Container
    host: Any
    caps: HostCaps
    mpi: MpiFlavor | None
    mpi_error: str = ""
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def foreign(self) -> bool:
        """Not built by trainbase: the manifest is the user's expectations file."""
        return bool(self.manifest.get("foreign"))

    @property
    def name(self) -> str:
        return str(self.manifest.get("name", short_name(self.ref)))

    @property
    def components(self) -> dict[str, Any]:
        components: dict[str, Any] = self.manifest["components"]
        return components

    @property
    def labels(self) -> dict[str, str]:
        return self.inspect.get("Config", {}).get("Labels") or {}

    @property
    def python(self) -> str:
        """The image's Python (the manifest's prefix), by absolute path."""
        return f"{self.components['python']['prefix']}/bin/python"

    def sh(self, cmd: str, timeout: int = 120) -> Any:   # testinfra's CommandResult (untyped)
        # testinfra has no timeout: coreutils' timeout bounds anything that could hang.
        return self.host.run(f"timeout {timeout} /bin/sh -c {shlex.quote(cmd)}")

    def login(self, cmd: str, timeout: int = 120) -> Any:
        return self.host.run(f"timeout {timeout} bash -lc {shlex.quote(cmd)}")

    def need_mpi(self) -> MpiFlavor:
        if self.mpi is None:
            pytest.fail(self.mpi_error)
        return self.mpi

    def doctor(self, args: str = "", env: dict[str, str] | None = None, login: bool = False,
               container: Container | None = None) -> tuple[int, dict[str, Any]]:
        """The image's own `tb-doctor --json` (the checks it ships, shared with this suite): its
        exit code and report, validated against docs/doctor.schema.json."""
        r = (container or self.container).exec(f"tb-doctor --json {args}", timeout=120, env=env, login=login)
        assert r.returncode in (0, 1), f"tb-doctor {args} exited {r.returncode}: {(r.stderr or r.stdout)[-1500:]}"
        report = json.loads(r.stdout)
        jsonschema.validate(report, DOCTOR_SCHEMA)
        return r.returncode, report

    def doctor_check(self, check_id: str, **kw: Any) -> dict[str, Any]:
        """One of the doctor's checks, run alone (``--only``), as its JSON entry."""
        _, report = self.doctor(f"--only {check_id}", **kw)
        return next(c for c in report["checks"] if c["id"] == check_id)

    def json_probe(self, cmd: str, timeout: int = 120) -> dict[str, Any]:
        r = self.sh(cmd, timeout)
        assert r.rc == 0, f"`{cmd}` exited {r.rc}: {r.stderr.strip()[-1500:]}"
        doc: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        return doc


def tbconf_lines(stdout: str) -> list[dict[str, Any]]:
    """The probes' machine output: one ``TBCONF {json}`` line per rank."""
    return [json.loads(ln.split("TBCONF ", 1)[1]) for ln in stdout.splitlines() if "TBCONF {" in ln]


def _start(image: str, caps: HostCaps, opts: Any = None, **kw: Any) -> Container:
    c = Container.start(image, opts or caps.run_options(), **kw)
    try:
        c.exec(f"mkdir -p {PROBE_DIR}", timeout=60)
        c.put(f"{PROBES}/.", PROBE_DIR)  # "/." copies the contents
    except Exception:
        c.remove()
        raise
    return c


@pytest.fixture(autouse=True)
def _trainbase_contract(request: pytest.FixtureRequest) -> None:
    """Checks of trainbase's own contract (tb-doctor, tb-launch, the manifest's extra fields,
    labels, SBOM) do not apply to an image trainbase did not build: skipped, saying so."""
    marker = request.node.get_closest_marker("trainbase_contract")
    if marker is None or "target" not in request.fixturenames:
        return
    target = request.getfixturevalue("target")
    if target.foreign:
        what = marker.args[0] if marker.args else "trainbase's own tools"
        pytest.skip(f"not applicable: checks {what}, which only trainbase-built images carry")


@pytest.fixture(scope="session")
def target(image: str, host_caps: HostCaps, pytestconfig: pytest.Config,
           record_testsuite_property: Callable[[str, object], None]) -> Iterator[Target]:
    import testinfra

    t0 = time.monotonic()
    inspect = inspect_image(image)
    try:
        emulator = ensure_emulator(inspect)
    except EmulationError as e:
        # every check of this image is skipped with the emulator's own cause and fix (never an
        # engine error at the first exec); the image and its tag are left as they are
        pytest.skip(f"this host cannot run {inspect.get('Os', 'linux')}/{e.arch} images now: {e.cause}. Fix: {e.fix}")
    container = _start(image, host_caps)
    try:
        manifest = expectations.image_manifest(image, container, pytestconfig.getoption("--expect"))
        mpi, mpi_error = None, ""
        try:
            mpi = MpiFlavor.from_manifest(manifest)
        except (KeyError, ValueError) as e:
            mpi_error = f"manifest names no MPI the suite knows: {e}"
        facts = {
            "id": inspect["Id"].split(":")[-1][:12],
            "size_GB": f"{inspect.get('Size', 0) / 1e9:.2f}",
            "manifest": manifest.get("name", "?"),
            "start_s": f"{time.monotonic() - t0:.1f}",
            "platform": emulated(inspect) or f"{inspect.get('Os', 'linux')}/{inspect.get('Architecture', '?')} (native)",
        }
        if emulator:
            facts["emulator"] = emulator
        pytestconfig.stash[_IMAGE_FACTS][short_name(image)] = facts
        for k, v in facts.items():
            record_testsuite_property(f"image[{short_name(image)}].{k}", v)
        yield Target(ref=image, inspect=inspect, manifest=manifest, container=container,
                     host=testinfra.get_host("docker://" + container.cid), caps=host_caps,
                     mpi=mpi, mpi_error=mpi_error)
    finally:
        container.remove()


@dataclass
class Cluster:
    """Two containers of the image on a private network (hostnames ``a`` and ``b``), sshd
    started with host keys made now and a client key made for this test only."""

    nodes: list[Container]
    network: str
    mpi: MpiFlavor
    python: str

    @property
    def hosts(self) -> list[str]:
        return [n.hostname for n in self.nodes]

    def launch(self, per_host: int, cmd: str, timeout: int = 180) -> engine.ExecResult:
        """Run ``cmd`` from node a across every node, ``per_host`` ranks each."""
        return self.nodes[0].exec(f"timeout {timeout} {self.mpi.across(self.hosts, per_host)} {cmd}",
                                  timeout=timeout + 30)


@contextlib.contextmanager
def start_cluster(target: Target, caps: HostCaps, extra: dict[str, dict[str, Any]] | None = None) -> Iterator[Cluster]:
    """Two containers of the image (hostnames ``a``, ``b``) on a private network with sshd;
    ``extra`` adds run options per hostname (e.g. a tmpfs only one node has)."""
    mpi = target.need_mpi()

    def opts(h: str) -> engine.RunOptions:
        return dataclasses.replace(caps.run_options(), **(extra or {}).get(h, {}))

    def probes(c: Container) -> None:
        c.exec(f"mkdir -p {PROBE_DIR}", timeout=60)
        c.put(f"{PROBES}/.", PROBE_DIR)

    with ssh_cluster(target.ref, opts, prepare=probes) as (nodes, network):
        yield Cluster(nodes=nodes, network=network, mpi=mpi, python=target.python)


@pytest.fixture(scope="session")
def cluster(target: Target, host_caps: HostCaps) -> Iterator[Cluster]:
    with start_cluster(target, host_caps) as c:
        yield c


# --------------------------------------------------------------------------- results and reports

def _image_param(item: pytest.Item) -> str | None:
    cs = getattr(item, "callspec", None)
    if cs is None or "image" not in cs.params or cs.params["image"] is None:
        return None
    return short_name(cs.params["image"])


def _check_name(item: pytest.Item) -> str:
    """The test name without the image parameter (other parameters kept): a row of the matrix."""
    cs = getattr(item, "callspec", None)
    other = {k: v for k, v in cs.params.items() if k != "image"} if cs is not None else {}
    if not other:
        return getattr(item, "originalname", item.name)
    return f"{getattr(item, 'originalname', item.name)}[{'-'.join(str(v) for v in other.values())}]"


def _module_name(item: pytest.Item) -> str:
    """The check module's short name (test_nccl); "" for an item no Python module collected."""
    module = getattr(item, "module", None)
    return module.__name__.rsplit(".", 1)[-1] if module else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    rep = outcome.get_result()
    image = _image_param(item)
    if image is None:
        return
    tier = next((t for t in TIERS if item.get_closest_marker(t)), "")
    if rep.when == "setup":
        item.user_properties.append(("image", image))
        item.user_properties.append(("tier", tier))
    message, longrepr = "", ""
    if rep.skipped:
        lr = rep.longrepr
        message = lr[2] if isinstance(lr, tuple) else str(lr)
        message = message.removeprefix("Skipped: ")
    elif rep.failed:
        longrepr = str(rep.longrepr)
        crash = getattr(rep.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else longrepr.strip().splitlines()[-1]
    state = "skipped" if rep.skipped else "failed" if rep.failed else "passed"
    if rep.when == "setup" and rep.failed:
        state = "error"
    module = _module_name(item)
    item.config.stash[_RESULTS].add(image, module, _check_name(item), rep.when, state, message, rep.duration,
                                    longrepr, order=(module, item.location[1] or 0))


def _write_report(config: pytest.Config) -> Path | None:
    """The Markdown matrix (image x check, evidence share). JUnit is pytest's own --junitxml:
    each test case carries its image and tier as properties, the host and image facts are
    test-suite properties (record_testsuite_property)."""
    results = config.stash[_RESULTS]
    if not results.rows:
        return None
    results.host = _caps(config).describe()
    images = list(dict.fromkeys(o.image for o in results.rows.values()))
    results.images = {im: config.stash[_IMAGE_FACTS].get(im, {}) for im in images}
    md = Path(config.getoption("--conformance-report"))
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(results.markdown())
    return md


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    md = _write_report(config)
    if md is None:
        return
    terminalreporter.section("trainbase conformance")
    terminalreporter.write(config.stash[_RESULTS].markdown())
    if config.stash[_RESULTS].evidence:
        terminalreporter.write_line(config.stash[_RESULTS].evidence_summary())
    if DERIVED_NOTE in config.stash:
        terminalreporter.write_line(config.stash[DERIVED_NOTE])
    terminalreporter.write_line(f"summary: {md}")
