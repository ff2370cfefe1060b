#!/usr/bin/env python3
"""Golden Adam / AdamW trajectories from PyTorch, for ztrain's optimizer unit test.

What it does
    Runs torch.optim.Adam and torch.optim.AdamW (float32 CPU tensors, foreach=False,
    i.e. torch/optim/adam.py:_single_tensor_adam; amsgrad, maximize, capturable,
    differentiable and fused all off) on one 16-element parameter for 6 steps with fixed
    gradients, and writes torch_adam.json next to this file: init, the gradient of every
    step, and param / exp_avg / exp_avg_sq after every step. Every value is a float32
    value converted exactly to a Python float and printed with repr (round-trips).
    Inputs come from torch.Generator seeded with SEED, so reruns are byte-identical.

How to rerun
    /work/shared/peers/setup_venv.sh /tmp/dsvenv     # once (torch + DeepSpeed from PyPI)
    source /tmp/dsvenv/env.sh
    python tests/data/optim/make_golden.py           # from the repository root

Versions used for the committed torch_adam.json
    torch 2.15.0+cu132 (CPU use), Python 3.11.7 (torch version also stored in the JSON).

Update order of _single_tensor_adam in that torch (step t counted from 1; scalars are
Python doubles converted to float32 where they meet a tensor; fma(a, b, c) = a*b + c
rounded once; every other op rounds to float32):
    Adam with weight_decay wd:   g = fma(float(wd), p, g)    (L2: grad.add(p, alpha=wd))
    AdamW with weight_decay wd:  p = p * float(1 - lr*wd)    (decoupled, before the moments)
    w = float(1 - beta1); d = g - m
    m = w < 0.5 ? fma(w, d, m) : fma(-d, 1 - w, g)           (lerp_(g, 1 - beta1))
    v = v * float(beta2);  v = fma(float(1 - beta2) * g, g, v)   (mul_, then addcmul_)
    bc1 = 1 - beta1**t; bc2 = 1 - beta2**t; step_size = lr / bc1   (doubles)
    denom = sqrt(v) / float(bc2**0.5) + float(eps)
    p = p + (float(-step_size) * m) / denom                   (addcdiv_)
    Checked on the committed data: a NumPy replay of exactly this sequence matches every
    param / exp_avg / exp_avg_sq bit for bit when it uses torch's own sqrt. torch's CPU
    float32 sqrt (this build, CPU capability AVX512, AMD EPYC) is not IEEE correctly
    rounded: it differs from sqrtf by 1 ULP on about 20% of random inputs, and with IEEE
    sqrtf the replay's params differ by up to 4 ULP (exp_avg / exp_avg_sq stay exact).
    So a C++ port should compare params with a few-ULP tolerance (or relative ~1e-6),
    and the moments can be compared exactly if it uses the same fma pattern.

DeepSpeed optimizer configs -> class (deepspeed 0.19.8, deepspeed/runtime/engine.py,
DeepSpeedEngine._configure_basic_optimizer and get_optimizer_configuration)
    * The type is lower-cased; "Adam" and "AdamW" share one path. adam_w_mode defaults to
      True (ADAM_W_MODE_DEFAULT in runtime/config.py), and the effective mode is
      (type == "adamw") or adam_w_mode: so "Adam" is AdamW-style (decoupled weight decay)
      unless "adam_w_mode": false, and "AdamW" is always decoupled (adam_w_mode false is
      ignored for it).
    * "torch_adam": true (default false) selects torch.optim.AdamW when the effective mode
      is true and torch.optim.Adam (L2 decay) when it is false ("Adam" with
      "adam_w_mode": false), passing the remaining params through plus foreach=<the
      config's "foreach", default None>. Note torch.optim.AdamW's own weight_decay default
      is 0.01 (Adam's is 0), so a torch_adam AdamW config without "weight_decay" decays.
    * Without torch_adam: DeepSpeedCPUAdam(adamw_mode=<effective mode>) when ZeRO CPU
      offload is on, else deepspeed.ops.adam.FusedAdam(adam_w_mode=<effective mode>)
      (its defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0, bias
      correction on; adam_w_mode=False there also means L2 added to the gradient).
"""

import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "torch_adam.json")
SEED = 20240611
N = 16
STEPS = 6


def inputs():
    g = torch.Generator().manual_seed(SEED)
    init = torch.randn(N, generator=g, dtype=torch.float32) * 0.5
    # gradient magnitudes from 1e-4 to 10 across the elements; the last element's gradient
    # is always 0 so that eps (and, for Adam with wd, the L2 term alone) is exercised.
    scales = torch.logspace(-4, 1, N, dtype=torch.float32)
    grads = torch.randn(STEPS, N, generator=g, dtype=torch.float32) * scales
    grads[:, N - 1] = 0.0
    return init, grads


def flist(t):
    assert t.dtype == torch.float32
    return [float(x) for x in t.tolist()]


def run(optimizer, lr, betas, eps, wd, init, grads):
    p = torch.nn.Parameter(init.clone())
    cls = {"Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}[optimizer]
    opt = cls([p], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False, amsgrad=False,
              maximize=False, capturable=False, differentiable=False, fused=None)
    case = {"name": f"{optimizer.lower()}_lr{lr:g}_b2_{betas[1]:g}_wd{wd:g}", "optimizer": optimizer, "lr": lr,
            "betas": list(betas), "eps": eps, "weight_decay": wd, "init": flist(init),
            "grads": [], "params": [], "exp_avg": [], "exp_avg_sq": []}
    for s in range(STEPS):
        p.grad = grads[s].clone()
        opt.step()
        st = opt.state[p]
        assert float(st["step"]) == s + 1
        case["grads"].append(flist(grads[s]))
        case["params"].append(flist(p.detach()))
        case["exp_avg"].append(flist(st["exp_avg"]))
        case["exp_avg_sq"].append(flist(st["exp_avg_sq"]))
    return case


def main():
    torch.use_deterministic_algorithms(True)
    init, grads = inputs()
    cases = []
    for optimizer, wd in [("Adam", 0.0), ("Adam", 0.1), ("AdamW", 0.1)]:
        for lr in (1e-3, 1e-2):
            for betas in ((0.9, 0.999), (0.9, 0.95)):
                cases.append(run(optimizer, lr, betas, 1e-8, wd, init, grads))
    assert len({c["name"] for c in cases}) == len(cases)
    head = {"generator": "tests/data/optim/make_golden.py", "torch": torch.__version__}
    text = json.dumps(head)[:-1] + ',\n "cases": [\n'
    text += ",\n".join(json.dumps(c, separators=(",", ":"), allow_nan=False) for c in cases)
    text += "\n]}\n"
    json.loads(text)
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT}: {len(cases)} cases, {len(text)} bytes")


if __name__ == "__main__":
    main()
