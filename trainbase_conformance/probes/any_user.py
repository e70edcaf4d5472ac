"""The frameworks' real start-up paths as the container's user, whoever that is (runtime tier,
test_runtime.py::test_frameworks_start_as_any_uid_in_group_0). Prints one JSON line:
{"uid": N, "gid": N, "steps": {step: {"ok": bool, "detail": str}}}.

Steps (each only where the image has what it needs):
- identity: getpass.getuser() answers and ~ is a writable directory other than /;
- torch.compile: a small function compiled by TorchInductor on the CPU (its cache is named
  after the user, under /tmp) and equal to eager;
- deepspeed_op: DeepSpeed's CPU Adam op loaded (prebuilt, or JIT-built under ~/.cache);
- lightning_fit: a one-process Lightning fit of one epoch (it writes its logs under the cwd).
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import os
import sys
import traceback


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def identity() -> str:
    user = getpass.getuser()
    home = os.path.expanduser("~")
    assert home not in ("", "/") and os.access(home, os.W_OK), f"HOME {home!r} is not a writable directory"
    return f"user {user}, HOME {home}"


def torch_compile() -> str:
    import torch

    def f(x):
        return torch.sin(x) + x * 2

    x = torch.arange(16, dtype=torch.float32)
    got = torch.compile(f)(x)
    assert torch.allclose(got, f(x)), "compiled result differs from eager"
    return "compiled and equal to eager"


def deepspeed_op() -> str:
    from deepspeed.ops.op_builder import CPUAdamBuilder

    op = CPUAdamBuilder().load()
    return f"cpu_adam loaded from {getattr(op, '__file__', '?')}"


def lightning_fit() -> str:
    import lightning as L
    import torch

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    assert trainer.global_step == 4, f"trained {trainer.global_step} steps, want 4"
    return "one epoch, 4 steps"


STEPS = {
    "identity": (identity, None),
    "torch.compile": (torch_compile, "torch"),
    "deepspeed_op": (deepspeed_op, "deepspeed"),
    "lightning_fit": (lightning_fit, "lightning"),
}


def main() -> int:
    out = {"uid": os.getuid(), "gid": os.getgid(), "steps": {}}
    for name, (step, needs) in STEPS.items():
        if needs and not _has(needs):
            continue
        try:
            out["steps"][name] = {"ok": True, "detail": step()}
        except BaseException as e:  # noqa: BLE001 -- every failure is the step's verdict, with its traceback's end
            tail = traceback.format_exc().strip().splitlines()[-3:]
            out["steps"][name] = {"ok": False, "detail": f"{type(e).__name__}: {e} | " + " / ".join(tail)}
    print("TBANYUSER " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
