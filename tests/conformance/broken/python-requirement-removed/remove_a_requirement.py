"""Uninstall one distribution that another installed distribution requires (the first such
pair, in name order): what a later `pip uninstall` or a conflicting install in a child image
does. Whatever needed it fails later, on the cluster, unless the requirement is checked."""

import importlib.metadata as md
import re
import subprocess
import sys

installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d for d in md.distributions()}
for name in sorted(installed):
    for req in installed[name].requires or []:
        if ";" in req:
            continue  # conditional (extra, platform): not always required
        dep = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", req).group(0)).lower()
        if dep in installed and dep not in ("pip", "setuptools", "wheel"):
            print(f"{name} requires {req!r}: uninstalling {dep}")
            subprocess.run(
                [sys.executable, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", dep], check=True
            )
            sys.exit(0)
sys.exit("no installed distribution requires another one: nothing to break")
