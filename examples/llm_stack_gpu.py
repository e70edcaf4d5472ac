"""The LLM stack on one GPU: TransformerEngine's FP8 Linear against a bf16 reference,
one TransformerLayer training step, and FlashAttention-4 against torch's
scaled_dot_product_attention -- forward and backward, each within a stated tolerance.

    python3 llm_stack_gpu.py            # every check this GPU can run; one JSON line at the end

Run by the conformance suite's GPU tier in the image, and as is on a GPU host with the same
packages (scripts/gpu-host-check.sh). A check the GPU cannot run (FP8 below sm_89,
FlashAttention-4 outside sm_90/sm_100) is reported as skipped with that reason, never as passed.
The comparisons (``rel_err``, ``fp8_verdict``, ``fa4_verdict``) are plain functions the unit tests
feed with numbers.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

# FP8 tolerances, relative Frobenius error against the bf16 layer with the same weights and
# inputs. E4M3 (forward) keeps 3 mantissa bits, E5M2 (gradients, HYBRID format) 2: measured on
# an H200 with current scaling, 1024x1024 at 256 tokens: ~0.03 forward, ~0.05 gradients.
FP8_FORWARD_TOL = 0.08
FP8_BACKWARD_TOL = 0.15
# An FP8 layer whose output equals the bf16 one to this precision did not run in FP8 at all
# (a recipe silently ignored, a fallback to bf16): that is a failure too.
FP8_MIN_DIFFERENCE = 1e-4
# FlashAttention's own test rule: its error against an fp32 reference at most this many times
# that of PyTorch's bf16 attention, plus an absolute floor.
FA4_FORWARD_FACTOR, FA4_BACKWARD_FACTOR, FA4_ATOL = 2.0, 3.0, 1e-3


def capabilities(cc: tuple[int, int]) -> dict[str, bool]:
    """FP8 GEMMs need sm_89+; FA4's kernels exist for sm_90 and sm_100/sm_103 (the doctor's
    gpu.llm_stack says the same)."""
    return {"fp8": cc >= (8, 9), "fa4": cc[0] in (9, 10)}


def rel_err(a: Any, b: Any) -> float:
    """||a - b|| / ||b|| in fp32."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def fp8_verdict(errors: dict[str, float]) -> dict[str, Any]:
    """errors: {"forward", "dgrad", "wgrad"} relative errors of the FP8 layer against bf16."""
    problems = []
    if errors["forward"] > FP8_FORWARD_TOL:
        problems.append(f"forward error {errors['forward']:.4f} > {FP8_FORWARD_TOL}")
    for k in ("dgrad", "wgrad"):
        if errors[k] > FP8_BACKWARD_TOL:
            problems.append(f"{k} error {errors[k]:.4f} > {FP8_BACKWARD_TOL}")
    if errors["forward"] < FP8_MIN_DIFFERENCE:
        problems.append(f"forward equals bf16 to {errors['forward']:.2e}: FP8 did not run")
    return {"ok": not problems, "errors": errors, "problems": problems}


def fa4_verdict(fa: dict[str, float], sdpa: dict[str, float]) -> dict[str, Any]:
    """fa / sdpa: max abs errors of FA4 and of torch's bf16 attention against an fp32 reference,
    for "out", "dq", "dk", "dv"."""
    problems = []
    for k in ("out", "dq", "dk", "dv"):
        factor = FA4_FORWARD_FACTOR if k == "out" else FA4_BACKWARD_FACTOR
        bound = factor * sdpa[k] + FA4_ATOL
        if not fa[k] <= bound:  # NaN fails too
            problems.append(f"{k}: FA4 error {fa[k]:.2e} > {factor} x torch's {sdpa[k]:.2e} + {FA4_ATOL}")
    return {"ok": not problems, "fa4": fa, "sdpa": sdpa, "problems": problems}


def fp8_linear(torch: Any) -> dict[str, Any]:
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    torch.manual_seed(0)
    layer = te.Linear(1024, 1024, bias=True, params_dtype=torch.bfloat16, device="cuda")
    ref = torch.nn.Linear(1024, 1024, bias=True, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        ref.weight.copy_(layer.weight)
        ref.bias.copy_(layer.bias)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    grad = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    # current scaling: each tensor's scale from its own amax (no history to warm up)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)):
        y = layer(x)
    y.backward(grad)
    yr = ref(xr)
    yr.backward(grad)
    errors = {
        "forward": rel_err(y, yr),
        "dgrad": rel_err(x.grad, xr.grad),
        "wgrad": rel_err(layer.weight.grad, ref.weight.grad),
    }
    return {"check": "te.fp8_linear", **fp8_verdict(errors)}


def transformer_layer_step(torch: Any, fp8: bool) -> dict[str, Any]:
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    torch.manual_seed(0)
    layer = te.TransformerLayer(
        1024, 4096, 16, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16, device="cuda"
    )
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x = torch.randn(128, 4, 1024, device="cuda", dtype=torch.bfloat16)  # (seq, batch, hidden)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        with te.fp8_autocast(enabled=fp8, fp8_recipe=recipe.Float8CurrentScaling()):
            out = layer(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        grads = [p.grad for p in layer.parameters() if p.grad is not None]
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        nonzero = any(bool(g.abs().sum() > 0) for g in grads)
        opt.step()
        losses.append(float(loss))
    problems = []
    if not all(math.isfinite(v) for v in losses):
        problems.append(f"loss not finite: {losses}")
    if not (finite and nonzero and grads):
        problems.append("gradients not finite or all zero")
    if losses[0] == losses[1]:
        problems.append("the optimizer step changed nothing")
    return {"check": "te.transformer_layer", "fp8": fp8, "ok": not problems, "losses": losses, "problems": problems}


def fa4_attention(torch: Any) -> dict[str, Any]:
    from flash_attn.cute import flash_attn_func
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    b, s, h, d = 2, 1024, 16, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)

    def grads(out: Any, *inputs: Any) -> tuple[Any, ...]:
        return torch.autograd.grad(out, inputs, dout)

    def sdpa(q: Any, k: Any, v: Any) -> Any:  # (b, s, h, d) in and out
        # the math backend: torch's flash backend may itself run FlashAttention-4's kernels
        # (on an H200 with torch 2.11 its errors equalled FA4's to the last bit), and a check
        # that compares FA4 with itself cannot fail
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
        return o.transpose(1, 2)

    out = flash_attn_func(q, k, v, causal=True)
    out = out[0] if isinstance(out, tuple) else out
    fa = (out, *grads(out, q, k, v))
    pt_out = sdpa(q, k, v)
    pt = (pt_out, *grads(pt_out, q, k, v))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref_out = sdpa(q32, k32, v32)
    ref = (ref_out, *torch.autograd.grad(ref_out, (q32, k32, v32), dout.float()))
    names = ("out", "dq", "dk", "dv")
    fa_err = {n: float((a.float() - r).abs().max()) for n, a, r in zip(names, fa, ref)}
    pt_err = {n: float((a.float() - r).abs().max()) for n, a, r in zip(names, pt, ref)}
    return {"check": "fa4.attention", **fa4_verdict(fa_err, pt_err)}


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no GPU visible to torch"}))
        return 2
    cc = torch.cuda.get_device_capability()
    can = capabilities(cc)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "cc": f"{cc[0]}.{cc[1]}",
        "torch": torch.__version__,
        "checks": [],
        "skipped": {},
    }
    runs = [
        ("te.fp8_linear", can["fp8"], lambda: fp8_linear(torch), "FP8 needs sm_89+"),
        ("te.transformer_layer", True, lambda: transformer_layer_step(torch, fp8=can["fp8"]), ""),
        (
            "fa4.attention",
            can["fa4"],
            lambda: fa4_attention(torch),
            "FlashAttention-4 has kernels for sm_90 and sm_100 only",
        ),
    ]
    for name, possible, run, why in runs:
        if not possible:
            report["skipped"][name] = f"{why}; this GPU is sm_{cc[0]}{cc[1]}"
            continue
        try:
            result = run()
        except Exception as e:  # noqa: BLE001 -- a check that cannot run on a GPU that should run it fails
            result = {"check": name, "ok": False, "problems": [f"{type(e).__name__}: {e}"[:2000]]}
        report["checks"].append(result)
        print(("OK " if result["ok"] else "FAIL ") + f"check={name} " + json.dumps(result), flush=True)
    print(json.dumps(report))
    return 0 if all(c["ok"] for c in report["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
