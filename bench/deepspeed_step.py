"""DeepSpeed reference for bench/bench_offload.sh: Hugging Face GPT-2 under
DeepSpeed ZeRO on this CPU (gloo between ranks), with the run ztrain's
bench uses: fp32, micro-batch --batch sequences of --seq tokens per rank,
AdamW lr 1e-3 betas (0.9, 0.95) eps 1e-8 weight decay 0.1, gradient
clipping 1.0, random tokens. --offload moves the optimizer (and with
--stage 3 the parameters) to host memory, which makes DeepSpeed step with
its own CPU Adam. Ranks are spawned here with torchrun's environment.
Prints one line: RESULT followed by JSON (median step time over the steps
after --warmup, on rank 0 and the slowest rank, and tokens/s of the job).
Not part of CI; needs torch, transformers and deepspeed:

    python bench/deepspeed_step.py --stage 3 --offload [--world 2] [--steps 8]
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

MODELS = {
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257),
    "gpt2-tiny": dict(n_layer=4, n_head=4, n_embd=256, vocab_size=4096),
}


def zero_config(args):
    zero = {"stage": args.stage}
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        if args.stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        },
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }


def rank_main(rank, args):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world),
                      LOCAL_WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port), DS_ACCELERATOR="cpu")
    import torch
    import torch.distributed as dist
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(args.threads)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    shape = MODELS[args.model]
    config = GPT2Config(**shape, n_positions=args.seq, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=zero_config(args))
    tokens = torch.Generator().manual_seed(1000 + rank)
    times = []
    for _ in range(args.warmup + args.steps):
        x = torch.randint(0, shape["vocab_size"], (args.batch, args.seq), generator=tokens)
        t0 = time.perf_counter()
        loss = engine(x, labels=x).loss
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    mine = statistics.median(times[args.warmup:])
    slowest = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        step = slowest.item()
        print("RESULT " + json.dumps(dict(
            deepspeed=deepspeed.__version__, torch=torch.__version__, model=args.model,
            stage=args.stage, offload=args.offload, world=args.world, threads=args.threads,
            batch=args.batch, seq=args.seq, median_step_s_rank0=round(mine, 4),
            median_step_s=round(step, 4),
            tokens_per_s=round(args.world * args.batch * args.seq / step, 1))), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank, args):
    try:
        rank_main(rank, args)
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=list(MODELS), default="gpt2-124m")
    ap.add_argument("--stage", type=int, choices=[1, 2, 3], default=3)
    ap.add_argument("--offload", action="store_true")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch.multiprocessing as mp

    mp.spawn(spawned, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
