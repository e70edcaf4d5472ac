"""DeepSpeed's fused CUDA optimizers on a GPU, from the ops prebuilt into the image: FusedAdam
(AdamW mode) checked step by step against torch.optim.AdamW, FusedLamb run, then a DeepSpeed
engine with `"optimizer": {"type": "AdamW"}` -- which DeepSpeed maps to FusedAdam -- trains a
small model for a few steps. One process; prints one JSON line, exits 1 on a wrong value.

With PROBE_ALLOW_JIT unset, an op that is not prebuilt fails the probe instead of compiling."""

import json
import os
import sys
import time

import torch

out = {"probe": "deepspeed_gpu"}
from deepspeed.git_version_info import installed_ops  # noqa: E402

need = ["fused_adam", "fused_lamb"]
out["prebuilt"] = {o: bool(installed_ops.get(o)) for o in need}
if not all(out["prebuilt"].values()) and not os.environ.get("PROBE_ALLOW_JIT"):
    out["error"] = f"ops not prebuilt (the first step would JIT-compile them with nvcc): {out['prebuilt']}"
    print(json.dumps(out), flush=True)
    sys.exit(1)
from deepspeed.ops.adam import FusedAdam  # noqa: E402
from deepspeed.ops.lamb import FusedLamb  # noqa: E402

torch.manual_seed(0)
dev = torch.device("cuda")
shapes = [(1024, 1024), (4096,), (333, 77)]
ref = [torch.randn(s, device=dev, requires_grad=True) for s in shapes]
mine = [p.detach().clone().requires_grad_(True) for p in ref]
kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
opt_ref = torch.optim.AdamW(ref, **kw)
t0 = time.perf_counter()
opt = FusedAdam(mine, adam_w_mode=True, **kw)
out["fused_adam_load_s"] = round(time.perf_counter() - t0, 2)
for _step in range(20):
    grads = [torch.randn(s, device=dev) for s in shapes]
    for p, q, g in zip(ref, mine, grads):
        p.grad, q.grad = g.clone(), g.clone()
    opt_ref.step()
    opt.step()
err = max(float((p - q).detach().abs().max()) for p, q in zip(ref, mine))
out["fused_adam_vs_torch_adamw_max_err"] = err
out["fused_adam_ok"] = err < 1e-5
lamb_p = [torch.randn(s, device=dev, requires_grad=True) for s in shapes]
before = [p.detach().clone() for p in lamb_p]
lamb = FusedLamb(lamb_p, lr=1e-3)
for p in lamb_p:
    p.grad = torch.randn_like(p)
lamb.step()
moved = [float((p - b).abs().max()) for p, b in zip(lamb_p, before)]
out["fused_lamb_ok"] = all(0 < m < 1 for m in moved) and all(torch.isfinite(p).all() for p in lamb_p)

# a DeepSpeed engine as a config asks for it: one process, NCCL, AdamW -> FusedAdam
import deepspeed  # noqa: E402

os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
deepspeed.init_distributed(dist_backend="nccl")
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10))
config = {
    "train_micro_batch_size_per_gpu": 64,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 1},
    "bf16": {"enabled": True},
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
inner = getattr(optimizer, "optimizer", optimizer)
out["engine_optimizer"] = type(inner).__name__
x = torch.randn(64, 512, device=engine.device, dtype=torch.bfloat16)
y = torch.randint(0, 10, (64,), device=engine.device)
losses = []
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(30):
    loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
    engine.backward(loss)
    engine.step()
    losses.append(float(loss))
torch.cuda.synchronize()
out["engine_steps_per_s"] = round(30 / (time.perf_counter() - t0), 1)
out["loss_first_last"] = [round(losses[0], 4), round(losses[-1], 4)]
out["engine_ok"] = out["engine_optimizer"] == "FusedAdam" and losses[-1] < losses[0] * 0.8
out["ok"] = bool(out["fused_adam_ok"] and out["fused_lamb_ok"] and out["engine_ok"])
print(json.dumps(out), flush=True)
sys.exit(0 if out["ok"] else 1)
