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

This module is the entry point only; the plugin's parts live by concern in the modules below.
"""

from __future__ import annotations

import pytest

from . import MARKERS

# Each part is a plugin of its own, registered by pytest under its module name as this module
# is loaded (by -p or the pytest11 entry point alike). Rather than importing their hooks and
# fixtures here for pytest to find by name: a hook or fixture added to a part is found where it
# is written, with no list here to keep in step (a forgotten re-export would be a hook that
# silently never runs), and pytest rewrites each part's asserts (Target.doctor's) as it does a
# plugin's. So nothing may import those hooks into this module (pytest would call them twice),
# and the list is in import order: a part comes before every part that imports it (emulation:
# containers.py, which collection and fixtures import, imports it), since pytest cannot rewrite
# the asserts of a module already imported, and says so in every run.
pytest_plugins = [
    "trainbase_conformance.options",  # the command-line options
    "trainbase_conformance.emulation",  # native_only checks skipped on an image run under qemu
    "trainbase_conformance.collection",  # images, selection, order, tiers skipped before any container
    "trainbase_conformance.fixtures",  # host_caps, target, cluster; trainbase's contract on foreign images
    "trainbase_conformance.reporting",  # outcomes into the matrix, the Markdown summary
]


def pytest_configure(config: pytest.Config) -> None:
    # the markers the checks use: an installed suite has no pyproject.toml to declare them
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
