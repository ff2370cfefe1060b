"""PyTorch reference for bench_cpu_step: the same GPT-2 shapes and batch,
Hugging Face GPT2LMHeadModel + torch.optim.AdamW, fp32, on the same cores.
Not part of CI; run with a Python that has torch and transformers:

    python bench/pytorch_step.py [--threads 2] [--steps 5]
"""
import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

MODELS = {
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=64, batch=4),
    "gpt2-tiny": dict(n_layer=4, n_head=4, n_embd=256, vocab_size=4096, n_positions=256, batch=8),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name, m in MODELS.items():
        batch = m.pop("batch")
        cfg = GPT2Config(**m, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
        T = m["n_positions"]
        x = torch.randint(0, m["vocab_size"], (batch, T))
        total = 0.0
        for step in range(args.steps + 2):
            t0 = time.perf_counter()
            loss = model(x, labels=x).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=False)
            if step >= 2:
                total += time.perf_counter() - t0
        n = sum(p.numel() for p in model.parameters())
        tokens = batch * T * args.steps
        flops = (6 * n + 12 * m["n_layer"] * m["n_embd"] * T) * tokens / total
        print(f"{name}: torch {torch.__version__}, {args.threads} threads: step {total / args.steps:.3f} s, "
              f"{tokens / total:.0f} tokens/s, {flops / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
