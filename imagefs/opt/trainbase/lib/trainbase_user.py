"""Any user id: imported at every start of the image's Python by trainbase.pth (site-packages).

Why: OpenShift, many Kubernetes clusters and Slurm sites (pyxis/enroot, Apptainer) start the
container as a uid the image's /etc/passwd does not know -- OpenShift an arbitrary one in group 0,
often with a read-only root. Docker then sets HOME=/ (not writable) and no USER, and a training
job's first step fails: `torch.compile` died with ``KeyError: 'getpwuid(): uid not found:
1000680000'`` (TorchInductor names its cache after getpass.getuser(), which falls back to the
passwd database), and every cache that lives under ~ (Triton's, torch.utils.cpp_extension's and
DeepSpeed's build directories, Hugging Face's, pip --user) had nowhere to go (issue 62).

What, and only for such a process (root and any user with a passwd entry and a writable home are
left exactly as they are):
- ``USER`` and ``LOGNAME``, when neither is set, become ``uid<N>``: getpass.getuser() reads
  them before the passwd database, so code that names things after the user works;
- ``HOME``, when unset, ``/`` or not writable, becomes ``/home/trainbase`` where that is
  writable (the image makes it group 0 and group-writable: OpenShift's rule for arbitrary uids),
  else ``$TMPDIR/home-<uid>`` (0700: a read-only root with a writable /tmp). Every default that
  derives from ~ (XDG_CACHE_HOME, TORCH_EXTENSIONS_DIR, HF_HOME, TRITON_CACHE_DIR, PYTHONUSERBASE,
  ~/.cache) follows it; a value the user set is never replaced.
Child processes (compilers, ninja, mpirun) inherit the environment. Nothing is written anywhere
else. TRAINBASE_USER_HOOK=0 switches it off.
"""

import os
import pwd
import tempfile

SHARED_HOME = "/home/trainbase"


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def adopt(environ: "os._Environ[str] | dict[str, str]", uid: int, known: bool) -> dict[str, str]:
    """What this process's environment needs (the variables set, for the caller to read): a
    name and a writable home for a uid without a passwd entry or with an unwritable home."""
    home = environ.get("HOME", "")
    home_ok = home not in ("", "/") and _writable_dir(home)
    if environ.get("TRAINBASE_USER_HOOK", "1") == "0" or (known and home_ok):
        return {}
    changes: dict[str, str] = {}
    if not known and not (environ.get("USER") or environ.get("LOGNAME")):
        changes["USER"] = changes["LOGNAME"] = f"uid{uid}"
    if not home_ok:
        if _writable_dir(SHARED_HOME):
            new_home = SHARED_HOME
        else:
            new_home = os.path.join(tempfile.gettempdir(), f"home-{uid}")
            try:
                os.makedirs(new_home, mode=0o700, exist_ok=True)
            except OSError:
                new_home = ""
        if new_home:
            changes["HOME"] = new_home
    environ.update(changes)
    return changes


if os.environ.get("TRAINBASE_USER_HOOK", "1") != "0":
    adopt(os.environ, os.getuid(), _known(os.getuid()))
