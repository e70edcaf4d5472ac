"""Exit hook, imported at every start of the image's Python by trainbase.pth (site-packages).

Why: a PyTorch job that finished its work could still abort at exit ("terminate called without
an active exception", exit 134) -- 3 of 72 good two-node runs on the PyTorch 2.15 image. A
process group whose last Python reference sits in a reference cycle (DDP and its reducer, a
Lightning strategy) survives `destroy_process_group()` and is only freed by the garbage
collection inside `Py_FinalizeEx`. Its gloo worker threads then drop tensor references, which
takes the GIL during finalization, which force-exits the thread, whose C++ unwind ends in
std::terminate (pytorch/pytorch#190489; CPython >= 3.14 makes such threads hang instead, gh-87135).

What: an atexit handler registered before any user code, so that it runs after every other
handler (atexit is last-in, first-out) and while the interpreter is still fully alive. When
torch.distributed was imported, it collects garbage: the cycles go, the process group's
destructor joins its worker threads now, and finalization finds no thread left to abort. It
changes nothing else: no group is destroyed or created, no exit code is touched, and nothing is
imported at start-up beyond this module. TRAINBASE_EXIT_HOOK=0 switches it off.
"""

import atexit
import os
import sys


def collect_distributed_leftovers() -> None:
    if "torch.distributed" not in sys.modules or os.environ.get("TRAINBASE_EXIT_HOOK", "1") == "0":
        return
    import gc

    gc.collect()


atexit.register(collect_distributed_leftovers)
