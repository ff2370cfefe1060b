#!/usr/bin/env python3
"""Golden files for ztrain's model oracle test (tests/unit/test_golden.cpp).

For a tiny GPT-2 and a tiny Llama with grouped key/value heads, this script
writes, per case, into tests/data/golden/<case>/:

- model.safetensors and config.json: the weights, as Hugging Face's
  save_pretrained writes them (GPT-2's Conv1D layout, the tied lm_head
  left out), which ztrain imports with [model] init_from;
- reference.safetensors: a batch (`inputs`, `targets`, token ids stored as
  F32, exact below 2^24), the mean cross-entropy `loss`, every `logits`
  value (B, T, V), and the gradient of the loss for every parameter as
  `grad.<Hugging Face name>` in the file's layout. Its metadata holds the
  ztrain [model] table of the case (`ztrain_model`), the loss in float64
  (`loss_fp64`) and the versions used.

The weights are random but not trivial: matrices N(0, 0.2^2) so attention is
far from uniform, biases N(0, 0.1^2), norm weights 1 + N(0, 0.1^2), and
non-default norm_eps, rope_theta and MLP width, so a setting ztrain ignores
shows. They are rounded to float32 (what the file holds); the forward and
backward then run in float64 from exactly those values, so the references
carry no float32 error of their own.

This is a development tool: it needs torch and transformers, CI does not.
Run it from the repository root:

    python3 tools/make_golden.py [--out tests/data/golden]

Made with torch 2.15.0 and transformers 5.24.0 (see each file's metadata).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

B, T, V, C, L, HEADS = 2, 13, 67, 32, 2, 4

CASES = {
    "gpt2": dict(
        hf=dict(
            model_type="gpt2",
            vocab_size=V,
            n_positions=T,
            n_embd=C,
            n_layer=L,
            n_head=HEADS,
            n_inner=4 * C,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=None,
        ),
        ztrain=dict(arch="gpt2", n_layer=L, n_head=HEADS, n_embd=C, vocab_size=V, seq_len=T,
                    norm_eps=1e-4),
    ),
    "llama": dict(
        hf=dict(
            model_type="llama",
            vocab_size=V,
            hidden_size=C,
            intermediate_size=48,
            num_hidden_layers=L,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=T,
            rms_norm_eps=1e-4,
            rope_theta=5000.0,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        ),
        ztrain=dict(arch="llama", n_layer=L, n_head=HEADS, n_kv_head=2, n_embd=C,
                    vocab_size=V, seq_len=T, intermediate_size=48, norm_eps=1e-4,
                    rope_theta=5000.0),
    ),
}


def toml_table(keys: dict) -> str:
    lines = ["[model]"]
    for k, v in keys.items():
        lines.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}")
    return "\n".join(lines) + "\n"


def randomise(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                value = 0.2 * noise
            elif name.endswith("bias"):
                value = 0.1 * noise
            else:  # a norm's weight
                value = 1.0 + 0.1 * noise
            p.copy_(value.to(p.dtype))


def make_case(name: str, spec: dict, out: Path, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    config = transformers.AutoConfig.for_model(**spec["hf"])
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomise(model, gen)
    model.eval()

    case_dir = out / name
    case_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(case_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        (case_dir / extra).unlink(missing_ok=True)

    inputs = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)

    exact = model.to(torch.float64)  # the float32 values, exactly
    exact.zero_grad()
    logits = exact(input_ids=inputs).logits  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()

    tensors = {
        "inputs": inputs.to(torch.float32).contiguous(),
        "targets": targets.to(torch.float32).contiguous(),
        "loss": loss.detach().to(torch.float32).reshape(1),
        "logits": logits.detach().to(torch.float32).contiguous(),
    }
    for pname, p in exact.named_parameters():
        tensors["grad." + pname] = p.grad.detach().to(torch.float32).contiguous()
    metadata = {
        "ztrain_model": toml_table(spec["ztrain"]),
        "loss_fp64": f"{loss.item():.17g}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "batch": json.dumps({"B": B, "T": T}),
    }
    save_file(tensors, case_dir / "reference.safetensors", metadata=metadata)
    size = sum(f.stat().st_size for f in case_dir.iterdir())
    print(f"{name}: loss {loss.item():.9f}, {len(tensors) - 4} gradients, {size} bytes in {case_dir}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/golden"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, (name, spec) in enumerate(CASES.items()):
        make_case(name, spec, args.out, seed=20261201 + i)


if __name__ == "__main__":
    main()
