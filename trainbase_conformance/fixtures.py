"""What a check is handed: the session fixture ``target`` (one long-running container per
image, parametrized so test ids name the image) or ``cluster`` (two containers on a private
network with sshd), ``host_caps``, and the skip of trainbase's own contract on an image it did
not build. A check reads the image's OWN manifest (/etc/trainbase/manifest.json) through
``target``, or for a foreign image the expectations file its user wrote (--expect,
expectations.py): no check knows any image by name."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pytest

from trainbase_common import engine
from trainbase_common.emulation import EmulationError

from . import expectations, session
from .containers import Container, inspect_image, short_name, ssh_cluster
from .emulation import emulated, ensure_emulator
from .flavors import MpiFlavor
from .host import HostCaps
from .resources import DOCTOR_SCHEMA as DOCTOR_SCHEMA_PATH
from .resources import PROBES

DOCTOR_SCHEMA = json.loads(DOCTOR_SCHEMA_PATH.read_text())
PROBE_DIR = "/tmp/tbconf"  # where the probes are copied in every container


@pytest.fixture(scope="session")
def host_caps(pytestconfig: pytest.Config, record_testsuite_property: Callable[[str, object], None]) -> HostCaps:
    caps = session.host_caps(pytestconfig)
    for k, v in caps.describe().items():
        record_testsuite_property(f"host.{k}", v)
    return caps


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
    # the claims of an expectations file given beside the image's own manifest that the
    # manifest does not make (expectations.disagreements): the image's verdict fails on them
    disagreements: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # an expectations file's undeclared component is looked for in this image's filesystem
        components = self.manifest.get("components")
        if isinstance(components, expectations.DeclaredComponents):
            components.finder = self.holds

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

    def sh(self, cmd: str, timeout: int = 120) -> Any:  # testinfra's CommandResult (untyped)
        # testinfra has no timeout: coreutils' timeout bounds anything that could hang.
        return self.host.run(f"timeout {timeout} /bin/sh -c {shlex.quote(cmd)}")

    def login(self, cmd: str, timeout: int = 120) -> Any:
        return self.host.run(f"timeout {timeout} bash -lc {shlex.quote(cmd)}")

    def need_mpi(self) -> MpiFlavor:
        """The declared MPI. An expectations file that declares none skips the check where the
        image holds no MPI launcher, and fails it where it holds one (expectations.undeclared)."""
        if self.mpi is None:
            if self.foreign and "mpi" not in self.components:
                self.components["mpi"]  # skipped or failed, saying what to declare
            pytest.fail(self.mpi_error)
        return self.mpi

    def holds(self, key: str) -> list[str]:
        """The files of the image that show it holds ``key`` (a component of
        expectations.COMPONENTS, or frameworks.NAME), found by name in its filesystem once."""
        if "holds" not in self.cache:
            r = self.sh(expectations.find_command(), timeout=600)
            self.cache["holds"] = expectations.found(r.stdout)
        held: list[str] = self.cache["holds"].get(key, [])
        return held

    def require(self, key: str) -> None:
        """A check needs ``key`` declared (a component, or frameworks.NAME): on an image with an
        expectations file that does not declare it, skipped where the image holds none of it and
        failed where it holds one (expectations.undeclared); nothing on a trainbase image."""
        if not self.foreign:
            return
        if key.startswith("frameworks."):
            if key.split(".", 1)[1] not in (self.manifest.get("frameworks") or {}):
                expectations.undeclared(self.components_source, key, self.holds(key))
        elif key not in self.components:
            self.components[key]

    @property
    def components_source(self) -> str:
        """The name of the expectations file (for an image trainbase did not build)."""
        return str(getattr(self.manifest["components"], "source", "the manifest"))

    def doctor(
        self, args: str = "", env: dict[str, str] | None = None, login: bool = False, container: Container | None = None
    ) -> tuple[int, dict[str, Any]]:
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


def _copy_probes(c: Container) -> None:
    c.exec(f"mkdir -p {PROBE_DIR}", timeout=60)
    c.put(f"{PROBES}/.", PROBE_DIR)  # "/." copies the contents


def _start(image: str, caps: HostCaps, opts: Any = None, **kw: Any) -> Container:
    c = Container.start(image, opts or caps.run_options(), **kw)
    try:
        _copy_probes(c)
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


def mpi_flavor(manifest: dict[str, Any]) -> tuple[MpiFlavor | None, str]:
    """The manifest's MPI, or None and why not. Asking an expectations file's components for an
    MPI it does not declare would skip (expectations.DeclaredComponents): asked here, once per
    image, that skipped every check of the image -- hygiene too -- and the run went green having
    checked nothing. Now only the checks that need an MPI (Target.need_mpi) skip, or fail."""
    if "mpi" not in manifest.get("components", {}):  # dict's own test, no lookup
        return None, "the manifest names no MPI (components.mpi)"
    try:
        return MpiFlavor.from_manifest(manifest), ""
    except (KeyError, ValueError) as e:
        return None, f"manifest names no MPI the suite knows: {e}"


@pytest.fixture(scope="session")
def target(
    image: str,
    host_caps: HostCaps,
    pytestconfig: pytest.Config,
    record_testsuite_property: Callable[[str, object], None],
) -> Iterator[Target]:
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
        manifest, disagreements = expectations.image_claims(image, container, pytestconfig.getoption("--expect"))
        mpi, mpi_error = mpi_flavor(manifest)
        native = f"{inspect.get('Os', 'linux')}/{inspect.get('Architecture', '?')} (native)"
        facts = {
            "id": inspect["Id"].split(":")[-1][:12],
            "size_GB": f"{inspect.get('Size', 0) / 1e9:.2f}",
            "manifest": manifest.get("name", "?"),
            "start_s": f"{time.monotonic() - t0:.1f}",
            "platform": emulated(inspect) or native,
        }
        if emulator:
            facts["emulator"] = emulator
        session.image_facts(pytestconfig)[image] = facts
        for k, v in facts.items():
            record_testsuite_property(f"image[{image}].{k}", v)
        yield Target(
            ref=image,
            inspect=inspect,
            manifest=manifest,
            container=container,
            host=testinfra.get_host("docker://" + container.cid),
            caps=host_caps,
            mpi=mpi,
            mpi_error=mpi_error,
            disagreements=disagreements,
        )
    finally:
        container.remove()


# --------------------------------------------------------------------------- two nodes


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
        return self.nodes[0].exec(
            f"timeout {timeout} {self.mpi.across(self.hosts, per_host)} {cmd}", timeout=timeout + 30
        )


@contextlib.contextmanager
def start_cluster(target: Target, caps: HostCaps, extra: dict[str, dict[str, Any]] | None = None) -> Iterator[Cluster]:
    """Two containers of the image (hostnames ``a``, ``b``) on a private network with sshd;
    ``extra`` adds run options per hostname (e.g. a tmpfs only one node has)."""
    mpi = target.need_mpi()

    def opts(h: str) -> engine.RunOptions:
        return dataclasses.replace(caps.run_options(), **(extra or {}).get(h, {}))

    with ssh_cluster(target.ref, opts, prepare=_copy_probes) as (nodes, network):
        yield Cluster(nodes=nodes, network=network, mpi=mpi, python=target.python)


@pytest.fixture(scope="session")
def cluster(target: Target, host_caps: HostCaps) -> Iterator[Cluster]:
    with start_cluster(target, host_caps) as c:
        yield c
