#!/usr/bin/env python3
"""PEFT reads what a ztrain LoRA run exports: a development check.

For golden cases of tests/data/golden (tools/make_golden.py), this trains
LoRA adapters on the case's directory with ztrain (rank 4 on every
projection, a few steps at a learning rate that moves B off zero), and then,
in float64:
- PEFT loads the run's OUT/adapter onto the base directory
  (PeftModel.from_pretrained: every adapter tensor found, none left over),
  and its logits on the golden batch must equal the logits transformers
  computes from OUT's merged weights;
- PEFT's merge_and_unload() of that adapter must give the weights ztrain
  merged into OUT/model.safetensors, tensor by tensor.
The tolerances are float32's: ztrain stores adapters and merged weights in
fp32, PEFT merges here in float64.

It needs torch, transformers, peft and safetensors; CI does not run it.
From the repository root, with ztrain built in build/:

    python3 tools/check_lora_export.py [--cases llama,qwen2,gpt2] [--work /tmp/lora_export]
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import peft
import torch
import transformers
from safetensors import safe_open

RUN = """[model]
from = "{golden}"
finetuning_type = "lora"
lora_rank = 4
lora_alpha = 8
lora_target = "all"
[data]
plugin = "synthetic"
[train]
steps = 3
micro_batch_size = 2
lr = 0.05
warmup_steps = 0
eval_every = 0
checkpoint_every = 0
save_final = true
out_dir = "{out}"
"""


def train(case: str, work: Path, ztrain: Path) -> Path:
    out = work / f"lora_{case}"
    toml = work / f"lora_{case}.toml"
    golden = Path("tests/data/golden") / case
    toml.write_text(RUN.format(out=out, golden=golden.resolve()))
    subprocess.run([str(ztrain), str(toml), "--set", "train.precision=\"fp32\""], check=True,
                   capture_output=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="llama,qwen2,gpt2")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lora_export"))
    ap.add_argument("--ztrain", type=Path, default=Path("build/bin/ztrain"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for case in args.cases.split(","):
        out = train(case, args.work, args.ztrain)
        golden = Path("tests/data/golden") / case
        ref = safe_open(str(golden / "reference.safetensors"), "pt")
        inputs = ref.get_tensor("inputs").long()
        base = transformers.AutoModelForCausalLM.from_pretrained(golden, dtype=torch.float64)
        adapted = peft.PeftModel.from_pretrained(base, out / "adapter", is_trainable=False)
        adapted = adapted.double().eval()
        b_norm = max(p.abs().max().item() for n, p in adapted.named_parameters() if "lora_B" in n)
        if b_norm == 0:
            raise SystemExit(f"{case}: every lora_B is zero: the run trained nothing to compare")
        merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
        with torch.no_grad():
            want = adapted(input_ids=inputs).logits
            got = merged(input_ids=inputs).logits
        logit_err = ((got - want).abs().max() / want.abs().max()).item()
        peft_merged = adapted.merge_and_unload().state_dict()
        ours = merged.state_dict()
        weight_err = 0.0
        for name, w in peft_merged.items():
            if name not in ours:
                raise SystemExit(f"{case}: {name} of PEFT's merge is not in the export")
            weight_err = max(weight_err, ((ours[name] - w).abs().max() / w.abs().max().clamp(min=1e-30)).item())
        print(f"{case}: largest lora_B {b_norm:.3e}; PEFT on the adapter against the merged export: "
              f"logits {logit_err:.2e} of the largest; merge_and_unload against the export's "
              f"weights: {weight_err:.2e} of each tensor's largest")
        if logit_err > 1e-5 or weight_err > 1e-6:
            raise SystemExit(f"{case}: the export is not PEFT's merge of its adapter")
    print(f"every adapter loads in PEFT {peft.__version__} and merges to the export")


if __name__ == "__main__":
    main()
