#!/usr/bin/env python3
"""AdamW in PyTorch and DeepSpeed on this CPU, for bench/bench_adamw.sh.

One step over a single fp32 parameter of --n elements with --threads
threads, for torch.optim.AdamW (fused=True, and foreach=True) and
deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode=True, its AVX CPU op).
Prints one line per variant: name, median ns per element over --steps
steps after --warmup. Same hyperparameters as bench_adamw (lr 1e-3,
betas 0.9/0.95, eps 1e-8, weight decay 0.1). Needs torch and deepspeed
(DS_ACCELERATOR=cpu; DeepSpeed builds its op on first use).
"""
import argparse
import os
import statistics
import time

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=float, default=1e8)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--variants", default="fused,foreach,deepspeed")
args = ap.parse_args()
os.environ["OMP_NUM_THREADS"] = str(args.threads)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402

torch.set_num_threads(args.threads)
n = int(args.n)
hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def optimizer(name, p):
    if name == "fused":
        return torch.optim.AdamW([p], fused=True, **hyper)
    if name == "foreach":
        return torch.optim.AdamW([p], foreach=True, **hyper)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam([p], adamw_mode=True, **hyper)


for name in args.variants.split(","):
    p = torch.nn.Parameter(torch.randn(n) * 0.02)
    p.grad = torch.randn(n) * 1e-3
    opt = optimizer(name, p)
    times = []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(f"{name} {statistics.median(times[args.warmup:]) / n * 1e9:.3f}", flush=True)
    del opt, p
