#!/usr/bin/env python3
"""Golden files for ztrain's model oracle test (tests/unit/test_golden.cpp).

For a tiny GPT-2 and tiny shapes of the Llama family (Llama with grouped
key/value heads, Mistral, Qwen2 with its q/k/v biases and tied head, a
TinyLlama-like multi-query shape, Llama 3.2 with llama3 RoPE scaling and a
tied head, Llama with attention_bias, mlp_bias and linear RoPE scaling),
this script writes, per case, into tests/data/golden/<case>/:

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

    python3 tools/make_golden.py [--out tests/data/golden] [--cases qwen2,mistral]

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
    # Mistral's class with a window longer than the sequence: full attention.
    "mistral": dict(
        hf=dict(
            model_type="mistral",
            vocab_size=V,
            hidden_size=C,
            intermediate_size=40,
            num_hidden_layers=L,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=T,
            sliding_window=4096,
            rms_norm_eps=1e-4,
            rope_parameters=dict(rope_type="default", rope_theta=20000.0),
            tie_word_embeddings=False,
        ),
        ztrain=dict(arch="llama", n_layer=L, n_head=HEADS, n_kv_head=2, n_embd=C,
                    vocab_size=V, seq_len=T, intermediate_size=40, norm_eps=1e-4,
                    rope_theta=20000.0),
    ),
    # Qwen2: biases on q, k and v (not o), and the small models' tied head.
    "qwen2": dict(
        hf=dict(
            model_type="qwen2",
            vocab_size=V,
            hidden_size=C,
            intermediate_size=56,
            num_hidden_layers=L,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=T,
            rms_norm_eps=1e-4,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            use_sliding_window=False,
            tie_word_embeddings=True,
        ),
        ztrain=dict(arch="llama", n_layer=L, n_head=HEADS, n_kv_head=2, n_embd=C,
                    vocab_size=V, seq_len=T, intermediate_size=56, norm_eps=1e-4,
                    rope_theta=1000000.0, attention_bias="qkv", tie_embeddings=True),
    ),
    # TinyLlama's proportions: many query heads over few key/value heads
    # (32 over 4 there; 8 over 1 here, head size 4).
    "tinyllama": dict(
        hf=dict(
            model_type="llama",
            vocab_size=V,
            hidden_size=C,
            intermediate_size=88,
            num_hidden_layers=L,
            num_attention_heads=8,
            num_key_value_heads=1,
            max_position_embeddings=T,
            rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            tie_word_embeddings=False,
        ),
        ztrain=dict(arch="llama", n_layer=L, n_head=8, n_kv_head=1, n_embd=C, vocab_size=V,
                    seq_len=T, intermediate_size=88, norm_eps=1e-5),
    ),
    # Llama 3.2: llama3 RoPE scaling (with an original context of 64, the
    # head's four frequencies fall in all three of its bands) and a tied head.
    "llama32": dict(
        hf=dict(
            model_type="llama",
            vocab_size=V,
            hidden_size=C,
            intermediate_size=48,
            num_hidden_layers=L,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            max_position_embeddings=T,
            rms_norm_eps=1e-5,
            rope_parameters=dict(rope_type="llama3", rope_theta=5000.0, factor=8.0,
                                 low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=64),
            tie_word_embeddings=True,
        ),
        ztrain=dict(arch="llama", n_layer=L, n_head=HEADS, n_kv_head=2, n_embd=C,
                    vocab_size=V, seq_len=T, intermediate_size=48, norm_eps=1e-5,
                    rope_theta=5000.0, rope_scaling="llama3", rope_factor=8.0,
                    rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                    rope_original_max_positions=64.0, tie_embeddings=True),
    ),
    # Llama's attention_bias (q, k, v and o) and mlp_bias, linear RoPE scaling.
    "llama_bias": dict(
        hf=dict(
            model_type="llama",
            vocab_size=V,
            hidden_size=C,
            intermediate_size=48,
            num_hidden_layers=L,
            num_attention_heads=HEADS,
            num_key_value_heads=4,
            max_position_embeddings=T,
            rms_norm_eps=1e-4,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
        ),
        ztrain=dict(arch="llama", n_layer=L, n_head=HEADS, n_kv_head=4, n_embd=C,
                    vocab_size=V, seq_len=T, intermediate_size=48, norm_eps=1e-4,
                    rope_scaling="linear", rope_factor=2.0, attention_bias="all",
                    mlp_bias=True),
    ),
}


def toml_table(keys: dict) -> str:
    lines = ["[model]"]
    for k, v in keys.items():
        if isinstance(v, bool):
            lines.append(f"{k} = {str(v).lower()}")
        else:
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
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    args = ap.parse_args()
    wanted = args.cases.split(",")
    unknown = sorted(set(wanted) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {list(CASES)}")
    torch.set_num_threads(1)
    # Each case's seed is fixed by its place in CASES, so one case can be
    # regenerated without changing the others.
    for i, (name, spec) in enumerate(CASES.items()):
        if name in wanted:
            make_case(name, spec, args.out, seed=20261201 + i)


if __name__ == "__main__":
    main()
