#!/usr/bin/env python3
"""DeepSpeed's ZeRO-Infinity on this CPU, for bench/bench_nvme_peer.sh.

A Hugging Face LlamaForCausalLM of configs/examples/llama_nvme.toml's
shape (3072 wide, 24 query heads over 8 key/value heads, MLP 8192, vocab
32000, untied head; --layers sets the depth) built under zero.Init on
the NVMe tier, trained by deepspeed.initialize with ZeRO-3, parameters and
optimizer state in swap files under --nvme-path, bf16, AdamW (DeepSpeed's
CPU Adam), micro-batch 1 of --seq random tokens, world 1 over gloo
(DS_ACCELERATOR=cpu). Prints one `RESULT {json}` line: parameters, each
step's seconds, the median of those after the first, peak RSS.

DeepSpeed 0.19.8's defaults fail at the second step here, for two reasons
of its own (both in deepspeed/runtime): the NVMe prefetch
(zero/partitioned_param_coordinator.py, __prefetch_nvme_param_partitions)
queues a parameter the trace holds twice, such as the head used at the end
of forward and the start of backward, and swap_tensor/
partitioned_param_swapper.py asserts "already assigned swap buffer";
and with stage3_max_reuse_distance 1e9 every parameter due again soon
keeps one of the 5 parameter swap buffers until none is left ("Not enough
buffers 0 for swapping 1"). So this run sets stage3_prefetch_bucket_size
and stage3_max_reuse_distance to 0, the settings with which it trains
(with losses equal to the same model's in host memory).
"""
import argparse
import json
import os
import resource
import statistics
import time

for key, value in dict(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29517").items():
    os.environ.setdefault(key, value)

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--nvme-path", default="/var/tmp/ds_nvme")
# DeepSpeed's default, 1e9, makes a model under a billion parameters one
# sub-group whose fp32 masters, moments and gradients it holds in RAM at
# once: the 1.0B model here was killed by the kernel at 24 GiB of RSS.
ap.add_argument("--sub-group-size", type=float, default=1e8)
args = ap.parse_args()

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.set_num_threads(args.threads)
config = LlamaConfig(num_hidden_layers=args.layers, hidden_size=3072, num_attention_heads=24,
                     num_key_value_heads=8, intermediate_size=8192, vocab_size=32000,
                     max_position_embeddings=max(args.seq, 2048), rope_theta=500000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=False)
config._attn_implementation = "sdpa"
os.makedirs(args.nvme_path, exist_ok=True)
ds_config = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "bf16": {"enabled": True},
    "gradient_clipping": 1.0,
    "zero_optimization": {
        "stage": 3,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
        "stage3_param_persistence_threshold": 0,
        "sub_group_size": int(args.sub_group_size),
        "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme_path, "buffer_count": 4},
        "offload_param": {"device": "nvme", "nvme_path": args.nvme_path, "buffer_count": 5,
                          "buffer_size": 100000000, "max_in_cpu": 0},
    },
    "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
            "overlap_events": True},
    "steps_per_print": 10**9,
}
deepspeed.init_distributed(dist_backend="gloo")
with deepspeed.zero.Init(config_dict_or_path=ds_config, remote_device="nvme",
                         dtype=torch.bfloat16):
    model = LlamaForCausalLM(config)
params = sum(p.ds_numel for p in model.parameters())
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=ds_config)
tokens = torch.Generator().manual_seed(0)
times = []
for step in range(args.steps):
    ids = torch.randint(0, config.vocab_size, (1, args.seq), generator=tokens)
    t0 = time.perf_counter()
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    times.append(time.perf_counter() - t0)
    print(f"step {step + 1} loss {loss.item():.4f} {times[-1]:.2f} s", flush=True)
print("RESULT " + json.dumps({
    "params": params, "step_s": [round(t, 3) for t in times],
    "median_step_s": statistics.median(times[1:] if len(times) > 1 else times),
    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}), flush=True)
