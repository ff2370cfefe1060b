"""PEFT reference for bench/bench_lora.sh: LoRA fine-tuning steps of a
Hugging Face GPT2LMHeadModel (or LlamaForCausalLM with --arch llama) built
from a config of the given sizes, fp32, on the same cores as ztrain's run.
PEFT's LoraConfig puts the adapters beside --targets (rank --rank, scale
--alpha / --rank, no dropout, fan_in_fan_out for GPT-2's Conv1D), and
torch.optim.AdamW (lr 1e-4, betas (0.9, 0.95), wd 0.1, as ztrain's run)
steps the adapters alone, after clipping their gradients to norm 1.0 as
ztrain's grad_clip does. Each step is a fresh batch of random tokens from a
seeded generator, drawn outside the timer. The model is built with
from_config: nothing is read from disk (transformers 5's from_pretrained
would want the `kernels` package, and random weights time the same).

Prints one line per step with its time, then one line `RESULT {json}`: the
median step over the steps after the first (the first pays for page
faults and torch's warm-up, as ztrain's does), tokens/s at that median,
the parameters PEFT trains, and the process's peak RSS
(getrusage; it counts Python and torch's own libraries too).
Not part of CI; needs torch, transformers and peft:

    python bench/peft_lora_step.py [--model gpt2-124m] [--batch 4] [--seq 256] [--threads 2] [--steps 6]
"""
import argparse
import json
import resource
import statistics
import time

import torch

# The sizes of ztrain's presets (configs/models); --layers etc. override them.
MODELS = {
    "gpt2-124m": dict(arch="gpt2", n_layer=12, n_head=12, n_embd=768, vocab=50257),
    "gpt2-tiny": dict(arch="gpt2", n_layer=4, n_head=4, n_embd=256, vocab=4096),
    "llama-tiny": dict(arch="llama", n_layer=4, n_head=4, n_embd=128, vocab=512),
}
# LLaMA-Factory's lora_target "all": every linear layer of the blocks (PEFT
# matches these as suffixes, so GPT-2's c_proj is both the attention's and
# the MLP's output projection, as in ztrain).
ALL_TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def build_model(args):
    if args.arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=args.layers, n_head=args.heads, n_embd=args.embd,
                         vocab_size=args.vocab, n_positions=args.seq,
                         bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg)
    from transformers import LlamaConfig, LlamaForCausalLM
    # ztrain's Llama MLP width when intermediate_size = 0: 8/3 of the width,
    # rounded up to a multiple of 256 (plugins/models/transformer).
    inter = args.intermediate or (8 * args.embd // 3 + 255) // 256 * 256
    cfg = LlamaConfig(num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads or args.heads, hidden_size=args.embd,
                      intermediate_size=inter, vocab_size=args.vocab,
                      max_position_embeddings=args.seq, rms_norm_eps=1e-5,
                      tie_word_embeddings=args.tie, attention_dropout=0.0)
    return LlamaForCausalLM(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(MODELS))
    ap.add_argument("--arch", choices=["gpt2", "llama"], help="default: the model's")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: 0 = --heads")
    ap.add_argument("--embd", type=int)
    ap.add_argument("--intermediate", type=int, default=0, help="llama MLP width; 0 = ztrain's default")
    ap.add_argument("--tie", action="store_true", help="llama: head tied to the embedding")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--targets", default="all", help='comma-separated module names, or "all"')
    ap.add_argument("--adam", choices=["fused", "foreach", "loop"], default="fused")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for key, value in MODELS[args.model].items():
        name = {"n_layer": "layers", "n_head": "heads", "n_embd": "embd"}.get(key, key)
        if getattr(args, name) is None:
            setattr(args, name, value)

    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    targets = ALL_TARGETS[args.arch] if args.targets == "all" else args.targets.split(",")
    model = get_peft_model(build_model(args), LoraConfig(
        r=args.rank, lora_alpha=args.alpha, target_modules=targets, lora_dropout=0.0,
        bias="none", fan_in_fan_out=args.arch == "gpt2", task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_all = sum(p.numel() for p in model.parameters())
    adam = {"fused": dict(fused=True), "foreach": dict(foreach=True), "loop": dict(foreach=False)}
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **adam[args.adam])
    print(f"{args.arch} {args.layers}x{args.embd} vocab {args.vocab}, {args.batch} x {args.seq} tokens, "
          f"LoRA r {args.rank} alpha {args.alpha:g} on {','.join(targets)}: trains {n_trainable} of "
          f"{n_all} parameters; torch {torch.__version__}, {args.threads} threads, attention "
          f"{model.config._attn_implementation}, AdamW {args.adam}",
          flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    times = []
    for step in range(1, args.steps + 1):
        x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        print(f"step {step}/{args.steps} | loss {loss.item():.4f} | {times[-1]:.4f} s", flush=True)

    steady = times[1:] or times
    median = statistics.median(steady)
    print("RESULT " + json.dumps({
        "median_step_s": median,
        "tokens_per_s": args.batch * args.seq / median,
        "steps_timed": len(steady),
        "trainable_params": n_trainable,
        "params": n_all,
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "threads": args.threads,
        "torch": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
