"""torch.compile on CUDA: inductor generates Triton kernels and builds Triton's launcher with the
C compiler it finds; a compiled training step (forward + backward) must match eager, then 20
compiled steps are timed. One process, one GPU; prints one JSON line, exits 1 on a wrong value.

An image without a C compiler, or whose Triton does not match its torch, fails at the first
compiled step -- which is where a user's job would."""

import json
import shutil
import sys
import time

import torch

out = {"probe": "torch_compile_gpu", "torch": torch.__version__, "cc": shutil.which("cc") or shutil.which("gcc")}
try:
    import triton

    out["triton"] = triton.__version__
except ImportError as e:  # inductor's GPU backend is Triton: without it nothing compiles for CUDA
    out["error"] = f"no Triton: {e}"
    print(json.dumps(out), flush=True)
    sys.exit(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).cuda()
x, y = torch.randn(128, 256, device="cuda"), torch.randint(0, 10, (128,), device="cuda")


def loss(m):
    return torch.nn.functional.cross_entropy(m(x), y)


eager = loss(model)
eager.backward()
eager_grads = [p.grad.detach().clone() for p in model.parameters()]
model.zero_grad()
compiled = torch.compile(model)
t = time.monotonic()
try:
    got = loss(compiled)
    got.backward()
    torch.cuda.synchronize()
except Exception as e:  # noqa: BLE001 -- what failed to compile is the finding: said in the JSON line
    out["ok"], out["error"] = False, " ".join(f"{type(e).__name__}: {e}".split())[:1500]
    print(json.dumps(out), flush=True)
    sys.exit(1)
out["first_step_s"] = round(time.monotonic() - t, 1)
out["loss_eager"], out["loss_compiled"] = float(eager.detach()), float(got.detach())
# the backward pass is compiled too (AOTAutograd): its gradients must be eager's
out["grad_max_err"] = max(float((p.grad - g).abs().max()) for p, g in zip(model.parameters(), eager_grads))
out["ok"] = bool(torch.allclose(got, eager, rtol=1e-3, atol=1e-3)) and out["grad_max_err"] < 1e-3
t = time.monotonic()
for _ in range(20):
    loss(compiled).backward()
torch.cuda.synchronize()
out["steps_per_s"] = round(20 / (time.monotonic() - t), 1)
print(json.dumps(out), flush=True)
sys.exit(0 if out["ok"] else 1)
