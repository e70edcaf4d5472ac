"""What the plugin's hooks and fixtures share across one pytest session, kept on the config's
stash and made on first use (so no hook has to run first to set it up): the host's
capabilities, probed once; the image x check results; the facts each image's fixture found."""

from __future__ import annotations

import pytest

from .host import HostCaps, probe_host
from .results import Results

_RESULTS = pytest.StashKey[Results]()
_CAPS = pytest.StashKey[HostCaps]()
_IMAGE_FACTS = pytest.StashKey[dict[str, dict[str, str]]]()


def host_caps(config: pytest.Config) -> HostCaps:
    """This host's GPUs and RDMA devices, probed once per session (collection needs them to skip
    a tier before any container starts, the ``host_caps`` fixture and the report after)."""
    if _CAPS not in config.stash:
        config.stash[_CAPS] = probe_host(shm_size=config.getoption("--shm-size"))
    return config.stash[_CAPS]


def results(config: pytest.Config) -> Results:
    """The image x check matrix the reports are made of."""
    return config.stash.setdefault(_RESULTS, Results())


def image_facts(config: pytest.Config) -> dict[str, dict[str, str]]:
    """Short image name -> what its ``target`` fixture found (id, size, platform, start time)."""
    return config.stash.setdefault(_IMAGE_FACTS, {})
