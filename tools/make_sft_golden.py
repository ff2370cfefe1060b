#!/usr/bin/env python3
"""Golden files for fine-tuning's loss (tests/unit/test_golden.cpp, "sft").

For the tiny Llama (grouped key/value heads) and Qwen2 (q/k/v biases, tied
head) of tests/data/golden, this script writes <case>/sft_reference.safetensors:
six examples of 4 to 13 tokens, each with Hugging Face labels (aligned with
the input ids, -100 where not trained: a masked prompt, a masked history
turn in the middle, one trained whole), and what transformers computes for
them in float64: each example run alone through the model (no padding, no
neighbour), the cross-entropy of every trained label summed over all six
and divided by their count (the global batch's trained tokens, as
transformers' num_items_in_batch does), and the gradient of that loss for
every parameter.

ztrain must reproduce it from rows laid out either way: one example a row,
padded with ignored targets, and packed several to a row with positions
restarting per example (the test lays the rows out; this file holds the
examples and the truth only).

Tensors: `ids.<i>`, `labels.<i>` (F32, exact), `grad.<Hugging Face name>`;
metadata: `loss_fp64`, the count of trained tokens, the versions used.

This is a development tool: it needs torch and transformers, CI does not.
Run it from the repository root after tools/make_golden.py:

    python3 tools/make_sft_golden.py [--dir tests/data/golden]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

CASES = ("llama", "qwen2")
V = 67  # tools/make_golden.py's vocabulary
# (tokens, labels rule): "prompt k" masks the first k labels, "history a b"
# masks labels [a, b), "all" trains every label.
EXAMPLES = [(4, "prompt 2"), (6, "prompt 3"), (3, "all"), (9, "history 3 6"), (5, "prompt 1"),
            (13, "prompt 4")]


def labels_of(ids: torch.Tensor, rule: str) -> torch.Tensor:
    labels = ids.clone()
    kind, *args = rule.split()
    if kind == "prompt":
        labels[: int(args[0])] = -100
    elif kind == "history":
        labels[int(args[0]) : int(args[1])] = -100
    return labels


def load_model(case_dir: Path) -> transformers.PreTrainedModel:
    """The case's model in float64 (its float32 values, exactly), eager attention."""
    config = transformers.AutoConfig.from_pretrained(case_dir)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(load_file(case_dir / "model.safetensors"),
                                                strict=False)
    # A tied head is not in the file (save_pretrained leaves it out).
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    model = model.to(torch.float64)
    model.eval()
    return model


def sft_loss(model: torch.nn.Module, examples) -> tuple[torch.Tensor, int]:
    """Each example alone through the model; the mean over every trained label."""
    total = torch.zeros((), dtype=torch.float64)
    trained = 0
    for ids, labels in examples:
        logits = model(input_ids=ids.unsqueeze(0)).logits[0]  # (L, V), this example alone
        shifted = labels[1:]  # position t predicts token t + 1
        total = total + F.cross_entropy(logits[:-1], shifted, ignore_index=-100, reduction="sum")
        trained += int((shifted != -100).sum())
    return total / trained, trained


def make_case(name: str, root: Path, seed: int) -> None:
    case_dir = root / name
    model = load_model(case_dir)
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for length, rule in EXAMPLES:
        ids = torch.randint(0, V, (length,), generator=gen)
        examples.append((ids, labels_of(ids, rule)))
    model.zero_grad()
    loss, trained = sft_loss(model, examples)
    loss.backward()
    tensors = {}
    for i, (ids, labels) in enumerate(examples):
        tensors[f"ids.{i}"] = ids.to(torch.float32).contiguous()
        tensors[f"labels.{i}"] = labels.to(torch.float32).contiguous()
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = p.grad.detach().to(torch.float32).contiguous()
    metadata = {
        "loss_fp64": f"{loss.item():.17g}",
        "trained": str(trained),
        "examples": str(len(examples)),
        "T": str(model.config.max_position_embeddings),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    save_file(tensors, case_dir / "sft_reference.safetensors", metadata=metadata)
    print(f"{name}: loss {loss.item():.9f} over {trained} trained tokens of {len(examples)} examples")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("tests/data/golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, name in enumerate(CASES):
        make_case(name, args.dir, seed=20261206 + i)


if __name__ == "__main__":
    main()
