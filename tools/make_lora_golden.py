#!/usr/bin/env python3
"""Golden files for LoRA fine-tuning (a C++ test of tests/unit reproduces them).

For the tiny GPT-2, Llama (grouped key/value heads) and Qwen2 (q/k/v biases,
tied head) of tests/data/golden, this script writes
<case>/lora_reference.safetensors: what Hugging Face peft computes, on top of
transformers, in float64, for a LoRA adapter on the case's model and the six
fine-tuning examples of tools/make_sft_golden.py.

The adapter: rank r = 4, lora_alpha = 8 (so scale = alpha / r = 2, plain
LoRA, not rsLoRA), lora_dropout = 0, bias "none", on every linear projection
of the blocks: Llama/Qwen2 q_proj, k_proj, v_proj, o_proj, gate_proj,
up_proj, down_proj; GPT-2 c_attn, c_proj, c_fc (both attn.c_proj and
mlp.c_proj; peft with fan_in_fan_out=True for GPT-2's Conv1D). The
embeddings, norms, biases and lm_head are frozen and not adapted. Every
lora_A and lora_B is N(0, 0.05^2), drawn from a seeded generator and rounded
to float32 (what the file holds), so B is not zero and A gets a gradient;
the forward and backward then run in float64 from exactly those values (and
the float32 values of model.safetensors).

The examples: the ids and labels (Hugging Face labels, aligned with the
input ids, -100 where not trained) are those of make_sft_golden.py, drawn
the same way; for llama and qwen2 they are checked to equal the `ids.<i>`,
`labels.<i>` of the case's sft_reference.safetensors, and for gpt2 (which
has no sft_reference) they are drawn with the seed make_sft_golden.py's
next case would get. Each example runs alone through the model (no padding,
no neighbour); the loss is the cross-entropy of every trained label (position
t predicts label t + 1) summed over all six and divided by their count.

Tensors (all F32):
- `ids.<i>`, `labels.<i>` (i = 0..5): as in sft_reference.safetensors,
  exact;
- `lora.<name>`: the adapter's value;
- `grad.<name>`: the gradient of the loss for it (every base parameter is
  frozen: the script asserts that only the adapter gets gradients).

<name> is ztrain's parameter name: the Hugging Face name of the adapted
weight with `.weight` replaced by `.lora_A.weight` or `.lora_B.weight`,
with GPT-2's `transformer.` prefix dropped, e.g.
`model.layers.0.self_attn.q_proj.lora_A.weight` or
`h.0.mlp.c_fc.lora_B.weight`. Shapes are torch.nn.Linear's (out, in)
layout: lora_A (r, in_features), lora_B (out_features, r), and the adapted
layer computes y = W x + b + scale * B (A x), i.e. delta_W = scale * B @ A in
(out, in) layout. This holds for GPT-2 too: peft stores its lora_A/lora_B as
nn.Linear modules in that same layout even on a Conv1D (whose own weight is
(in, out)), and its merged delta for a Conv1D is (scale * B @ A)^T; the
script asserts both, so nothing is converted.

Metadata: `loss_fp64` (peft's loss, float64), `merged_loss_fp64` (the same
loss computed without peft, as a cross-check: the base model with every
adapted weight replaced by W + scale * B @ A, asserted equal to 1e-12;
its weight gradients dW also give the adapter's by the chain rule,
grad_A = scale * B^T dW and grad_B = scale * dW A^T, asserted to 1e-10),
`trained` (the count of trained labels), `examples`, `T` (the case's
sequence length, as in sft_reference), `lora_rank`, `lora_alpha`,
`lora_scale`, `targets` (the comma list of targeted module names) and the
versions of torch, transformers and peft.

This is a development tool: it needs torch, transformers, safetensors and
peft, CI does not. Run it from the repository root after
tools/make_golden.py and tools/make_sft_golden.py:

    python3 tools/make_lora_golden.py [--dir tests/data/golden]

Made with torch 2.15.0, transformers 5.25.0 and peft 0.21.2 (see each
file's metadata).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import peft
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.dont_write_bytecode = True  # no tools/__pycache__ in the tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sft_golden import EXAMPLES, V, labels_of, load_model, sft_loss  # noqa: E402

RANK, ALPHA, STD = 4, 8, 0.05
SCALE = ALPHA / RANK
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CASES = {
    # name: (targets, Conv1D layout, per-layer adapted modules)
    "gpt2": (("c_attn", "c_proj", "c_fc"), True, 4),
    "llama": (LLAMA_TARGETS, False, 7),
    "qwen2": (LLAMA_TARGETS, False, 7),
}
# make_sft_golden.py seeds its cases 20261206 + index in ("llama", "qwen2");
# gpt2 takes the next one.
SFT_SEEDS = {"llama": 20261206, "qwen2": 20261207, "gpt2": 20261208}
LORA_SEED = 20261220


def draw_examples(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """make_sft_golden.py's six examples, drawn exactly as it draws them."""
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for length, rule in EXAMPLES:
        ids = torch.randint(0, V, (length,), generator=gen)
        examples.append((ids, labels_of(ids, rule)))
    return examples


def ztrain_name(peft_name: str, gpt2: bool) -> str:
    """base_model.model.<hf module>[.lora_X.default.weight] -> <module>[.lora_X.weight]."""
    prefix = "base_model.model."
    assert peft_name.startswith(prefix), peft_name
    name = peft_name[len(prefix):].replace(".default.", ".")
    if gpt2:
        assert name.startswith("transformer."), name
        name = name[len("transformer."):]
    return name


def make_case(name: str, index: int, root: Path) -> None:
    targets, conv1d, per_layer = CASES[name]
    case_dir = root / name
    model = load_model(case_dir)
    config = model.config
    T = str(config.max_position_embeddings)

    examples = draw_examples(SFT_SEEDS[name])
    sft_path = case_dir / "sft_reference.safetensors"
    if sft_path.exists():  # same rows as the sft golden, so the C++ test can reuse them
        with safe_open(sft_path, "pt") as f:
            assert f.metadata()["T"] == T, (f.metadata()["T"], T)
            assert int(f.metadata()["examples"]) == len(examples)
            for i, (ids, labels) in enumerate(examples):
                assert torch.equal(f.get_tensor(f"ids.{i}"), ids.to(torch.float32)), i
                assert torch.equal(f.get_tensor(f"labels.{i}"), labels.to(torch.float32)), i

    lora_config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none",
                                  target_modules=list(targets), fan_in_fan_out=conv1d)
    pmodel = peft.get_peft_model(model, lora_config)
    pmodel.eval()

    # The adapter: N(0, STD^2), rounded to float32, in named_parameters order.
    gen = torch.Generator().manual_seed(LORA_SEED + index)
    lora = {}  # ztrain name -> parameter
    with torch.no_grad():
        for pname, p in pmodel.named_parameters():
            if "lora_" not in pname:
                continue
            assert p.requires_grad and p.dtype == torch.float64, pname
            value = torch.randn(p.shape, generator=gen, dtype=torch.float32) * STD
            p.copy_(value.to(torch.float64))
            lora[ztrain_name(pname, conv1d)] = p

    # Layout: lora_A (r, in), lora_B (out, r) as nn.Linear; delta_W = scale * B @ A in
    # (out, in), i.e. its transpose in a Conv1D's (in, out) weight.
    adapted = {}  # ztrain module name -> peft LoRA layer
    for mname, module in pmodel.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            adapted[ztrain_name(mname, conv1d)] = module
    assert len(adapted) == per_layer * config.num_hidden_layers, sorted(adapted)
    assert set(lora) == {f"{m}.lora_{ab}.weight" for m in adapted for ab in "AB"}
    for mname, module in adapted.items():
        assert module.scaling["default"] == SCALE and module.fan_in_fan_out == conv1d, mname
        base = module.get_base_layer().weight
        A, B = lora[mname + ".lora_A.weight"], lora[mname + ".lora_B.weight"]
        out_f, in_f = (base.shape[1], base.shape[0]) if conv1d else tuple(base.shape)
        assert A.shape == (RANK, in_f) and B.shape == (out_f, RANK), (mname, A.shape, B.shape)
        delta = module.get_delta_weight("default")
        assert torch.allclose(delta.T if conv1d else delta, SCALE * B @ A, rtol=0, atol=1e-15)

    pmodel.zero_grad()
    loss, trained = sft_loss(pmodel, examples)
    loss.backward()
    for pname, p in pmodel.named_parameters():
        if "lora_" in pname:
            assert p.grad is not None and bool((p.grad != 0).any()), pname
        else:
            assert not p.requires_grad and p.grad is None, pname

    # Cross-check without peft: a fresh base model with W + scale * B @ A merged in. Its
    # loss must equal peft's, and by the chain rule (dW in (out, in) layout) peft's
    # gradients must be grad_A = scale * B^T @ dW and grad_B = scale * dW @ A^T.
    merged = load_model(case_dir)
    params = dict(merged.named_parameters())
    with torch.no_grad():
        for mname in adapted:
            hf = ("transformer." + mname if conv1d else mname) + ".weight"
            delta = SCALE * lora[mname + ".lora_B.weight"] @ lora[mname + ".lora_A.weight"]
            params[hf].add_(delta.T if conv1d else delta)  # Conv1D holds (in, out)
    merged.zero_grad()
    merged_loss, merged_trained = sft_loss(merged, examples)
    merged_loss.backward()
    assert merged_trained == trained
    assert abs(merged_loss.item() - loss.item()) <= 1e-12, (merged_loss.item(), loss.item())
    for mname in adapted:
        dW = params[("transformer." + mname if conv1d else mname) + ".weight"].grad
        dW = dW.T if conv1d else dW
        A, B = lora[mname + ".lora_A.weight"], lora[mname + ".lora_B.weight"]
        for got, want in ((A.grad, SCALE * B.T @ dW), (B.grad, SCALE * dW @ A.T)):
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-13), mname

    tensors = {}
    for i, (ids, labels) in enumerate(examples):
        tensors[f"ids.{i}"] = ids.to(torch.float32).contiguous()
        tensors[f"labels.{i}"] = labels.to(torch.float32).contiguous()
    for lname in sorted(lora):
        p = lora[lname]
        value = p.detach().to(torch.float32)
        assert torch.equal(value.to(torch.float64), p.detach())  # exact in the file
        tensors["lora." + lname] = value.contiguous()
        tensors["grad." + lname] = p.grad.detach().to(torch.float32).contiguous()
    metadata = {
        "loss_fp64": f"{loss.item():.17g}",
        "merged_loss_fp64": f"{merged_loss.item():.17g}",
        "trained": str(trained),
        "examples": str(len(examples)),
        "T": T,
        "lora_rank": str(RANK),
        "lora_alpha": str(ALPHA),
        "lora_scale": f"{SCALE:g}",
        "targets": ",".join(targets),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    out = case_dir / "lora_reference.safetensors"
    save_file(tensors, out, metadata=metadata)
    print(f"{name}: loss {loss.item():.9f} (merged, no peft: {merged_loss.item():.9f}) over "
          f"{trained} trained tokens of {len(examples)} examples; {len(adapted)} adapted "
          f"modules, {len(tensors)} tensors, {out.stat().st_size} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("tests/data/golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, name in enumerate(CASES):
        make_case(name, i, args.dir)


if __name__ == "__main__":
    main()
