#!/usr/bin/env python3
"""transformers reads what `ztrain export` writes: a development check.

For each golden case of tests/data/golden (tools/make_golden.py), this trains
the case's directory two steps at lr 0 with ztrain (`--model DIR`, so the
weights stay the golden ones), exports the run, loads the export with
transformers' AutoModelForCausalLM in float64 (no missing, unexpected or
mismatched tensors allowed) and compares its logits on the golden batch with
the golden logits. A config.json key the export gets wrong (a RoPE scaling,
a tied head, Qwen2's biases, norm_eps) shows as a logit error far above the
float32 rounding of the weights (about 3e-7 of the largest logit).

It needs torch and transformers; CI does not run it. From the repository
root, with ztrain built in build/:

    python3 tools/check_hf_export.py [--cases qwen2,llama32] [--work /tmp/hf_export]
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import torch
import transformers
from safetensors import safe_open

CASES = ["gpt2", "llama", "mistral", "qwen2", "tinyllama", "llama32", "llama_bias"]
RUN = """[data]
plugin = "synthetic"
[train]
steps = 2
micro_batch_size = 2
global_batch_size = 2
lr = 0.0
checkpoint_every = 2
out_dir = "{out}"
"""


def export(case: str, work: Path, ztrain: Path) -> Path:
    run_dir, exp = work / f"run_{case}", work / f"export_{case}"
    toml = work / f"{case}.toml"
    toml.write_text(RUN.format(out=run_dir))
    golden = Path("tests/data/golden") / case
    for cmd in ([ztrain, "--model", golden, toml], [ztrain, "export", run_dir, exp, "--overwrite"]):
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True)
    return exp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--work", type=Path, default=Path("/tmp/hf_export"))
    ap.add_argument("--ztrain", type=Path, default=Path("build/bin/ztrain"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    worst = 0.0
    for case in args.cases.split(","):
        exp = export(case, args.work, args.ztrain)
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            exp, output_loading_info=True, dtype=torch.float64)
        problems = {k: v for k, v in info.items() if v}
        if problems:
            raise SystemExit(f"{case}: transformers loaded the export with {problems}")
        ref = safe_open(f"tests/data/golden/{case}/reference.safetensors", "pt")
        want = ref.get_tensor("logits").double()
        got = model.eval()(input_ids=ref.get_tensor("inputs").long()).logits.detach()
        err = ((got - want).abs().max() / want.abs().max()).item()
        worst = max(worst, err)
        print(f"{case}: {type(model).__name__}, largest logit error {err:.2e} of the largest logit")
        if err > 1e-6:
            raise SystemExit(f"{case}: the export computes other logits than the golden model")
    print(f"every export loads in transformers {transformers.__version__}; worst {worst:.2e}")


if __name__ == "__main__":
    main()
