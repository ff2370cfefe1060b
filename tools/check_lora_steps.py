#!/usr/bin/env python3
"""Three AdamW steps of LoRA in ztrain against PEFT and torch: a development check.

Both sides start from the same adapters: PEFT draws them on a golden
directory of tests/data/golden (rank 4, alpha 8, every projection of the
blocks) and saves them, and ztrain starts from that save ([model]
adapter_from). Both train on the same token stream (a nanoGPT .bin file;
ztrain's tokens source unshuffled reads sequence i as tokens
[i*T, i*T + T + 1), two a step), with the same AdamW (lr 1e-2, betas
0.9/0.999, eps 1e-8, weight decay 0.01, decoupled, no clipping, a constant
schedule), in float32. Each step's loss must agree, and after three steps
every adapter tensor (ztrain's OUT/adapter against PEFT's) within float32's
accumulated rounding.

It needs torch, transformers, peft, safetensors and numpy; CI does not run
it. From the repository root, with ztrain built in build/:

    python3 tools/check_lora_steps.py [--cases llama,qwen2,gpt2] [--work /tmp/lora_steps]
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import numpy as np
import peft
import torch
import transformers
from safetensors import safe_open

T, MICRO, STEPS, LR = 13, 2, 3, 1e-2
TARGETS = {"gpt2": ["c_attn", "c_proj", "c_fc"],
           "default": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
RUN = """[model]
from = "{golden}"
seq_len = {T}
finetuning_type = "lora"
lora_rank = 4
lora_alpha = 8
lora_target = "all"
adapter_from = "{adapter}"
[data]
plugin = "tokens"
path = "{tokens}"
shuffle = false
val_fraction = 0.0
[train]
steps = {steps}
micro_batch_size = {micro}
grad_accum = 1
lr = {lr}
schedule = "constant"
warmup_steps = 0
betas = [0.9, 0.999]
eps = 1e-8
weight_decay = 0.01
grad_clip = 0.0
precision = "fp32"
eval_every = 0
checkpoint_every = 0
log_every = 1
save_final = true
out_dir = "{out}"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="llama,qwen2,gpt2")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lora_steps"))
    ap.add_argument("--ztrain", type=Path, default=Path("build/bin/ztrain"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for case in args.cases.split(","):
        golden = (Path("tests/data/golden") / case).resolve()
        work = args.work / case
        subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir(parents=True)
        torch.manual_seed(0)
        base = transformers.AutoModelForCausalLM.from_pretrained(golden, dtype=torch.float32)
        vocab = base.config.vocab_size
        tokens = np.random.default_rng(1).integers(0, vocab, size=MICRO * STEPS * T + 1, dtype=np.uint16)
        tokens.tofile(work / "tokens.bin")
        config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                 target_modules=TARGETS.get(case, TARGETS["default"]))
        model = peft.get_peft_model(base, config)
        model.save_pretrained(work / "init")
        (work / "run.toml").write_text(RUN.format(golden=golden, T=T, adapter=work / "init",
                                                  tokens=work / "tokens.bin", steps=STEPS, micro=MICRO,
                                                  lr=LR, out=work / "out"))
        subprocess.run([str(args.ztrain), str(work / "run.toml")], check=True, capture_output=True)
        ours = [json.loads(l)["loss"] for l in open(work / "out" / "metrics.jsonl")
                if '"split": "train"' in l]
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                foreach=False)
        theirs = []
        seq = torch.from_numpy(tokens.astype(np.int64))
        for step in range(STEPS):
            rows = torch.stack([seq[i * T:i * T + T + 1] for i in range(step * MICRO, (step + 1) * MICRO)])
            logits = model(input_ids=rows[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            theirs.append(loss.item())
        model.save_pretrained(work / "torch")
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
        mine = safe_open(str(work / "out" / "adapter" / "adapter_model.safetensors"), "pt")
        peers = safe_open(str(work / "torch" / "adapter_model.safetensors"), "pt")
        names = sorted(peers.keys())
        if sorted(mine.keys()) != names:
            raise SystemExit(f"{case}: the adapters' names differ: {sorted(mine.keys())[:3]} / {names[:3]}")
        weight_err = max(((mine.get_tensor(n) - peers.get_tensor(n)).abs().max()
                          / peers.get_tensor(n).abs().max()).item() for n in names)
        print(f"{case}: losses ztrain {['%.6f' % x for x in ours]} torch {['%.6f' % x for x in theirs]}: "
              f"{loss_err:.1e} apart (relative); adapters after {STEPS} steps: {weight_err:.1e} of each "
              f"tensor's largest")
        if len(ours) != STEPS or loss_err > 1e-5 or weight_err > 1e-4:
            raise SystemExit(f"{case}: ztrain's LoRA steps are not PEFT and torch's")
    print(f"three AdamW steps of LoRA agree with PEFT {peft.__version__} and torch {torch.__version__}")


if __name__ == "__main__":
    main()
