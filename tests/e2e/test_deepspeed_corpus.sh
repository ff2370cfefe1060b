#!/usr/bin/env bash
# DeepSpeed configs as people publish them, run as DeepSpeed means them.
# - tests/data/deepspeed holds 42 files of the published shapes (the
#   Hugging Face Trainer's ZeRO examples with "auto" everywhere,
#   DeepSpeedExamples, fine-tuning repositories' ds_z*_config.json, ...)
#   and expected.json, written from DeepSpeed's semantics, not ztrain's:
#   for each, DeepSpeed's outcome and, where it trains, the strategy,
#   precision, batch, optimizer values and the lr of each of its first 6
#   steps as DeepSpeed 0.19.8's own scheduler classes give them
#   (make_expected_lr.py there recomputes them).
# - Each file that trains trains here, 6 steps of a tiny GPT-2 at its world
#   size, and the run's resolved config and logged lr must be those.
# - Each file DeepSpeed refuses, or that asks for what ztrain does not do,
#   is refused with an error naming the key.
#
# usage: test_deepspeed_corpus.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

corpus=$SRC/tests/data/deepspeed
disk_dir swap
python3 - "$ZTRAIN" "$corpus" "$scratch" "$swap" << 'PY' || fail "the corpus is not run as DeepSpeed runs it"
import json, math, os, subprocess, sys, tomllib

ztrain, corpus, scratch, swap = sys.argv[1:5]
expected = json.load(open(os.path.join(corpus, "expected.json")))
run_toml = os.path.join(scratch, "run.toml")
open(run_toml, "w").write(expected["run_toml"])
model = ["--model", "gpt2-tiny", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
         "--set", "model.seq_len=16", "--set", "model.vocab_size=128", "--set", "device.threads=1",
         "--set", "train.log_every=1", "--set", "train.eval_every=0",
         "--set", "train.save_final=false"]
failures, trained, refused = [], 0, 0

def run(entry, out_dir):
    path = os.path.join(corpus, entry["file"])
    args = [ztrain, "--deepspeed", path, "--nproc", str(entry["world"])] + model
    args += ["--set", "train.out_dir=" + out_dir]
    if "nvme" in open(path).read():  # swap files on a real disk, not /tmp
        args += ["--set", "strategy.offload_optimizer.nvme_path=" + swap]
    return subprocess.run(args + [run_toml], capture_output=True, text=True, timeout=600)

def close(a, b, rel=5e-9):
    return abs(a - b) <= rel * abs(b) + 1e-15

def check_trained(entry, out_dir, out):
    want = entry["expect"]
    cfg = tomllib.load(open(os.path.join(out_dir, "config.toml"), "rb"))
    train, strategy = cfg["train"], cfg["strategy"]
    got = {"strategy": strategy["plugin"], "precision": train.get("precision", "fp32")}
    problems = [f"{k}: {got[k]} where DeepSpeed gives {want[k]}" for k in got if got[k] != want[k]]
    lines = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    steps = [l for l in lines if l.get("split") == "train"]
    # The run's header: "batch: M x A accum x W rank(s) = G sequences".
    batch = f"batch: {want['micro_batch_size']} x {want['grad_accum']} accum x {entry['world']} "
    if batch not in out or f"= {want['global_batch_size']} sequences" not in out:
        problems.append(f"batch is not {want['micro_batch_size']} x {want['grad_accum']} x "
                        f"{entry['world']} = {want['global_batch_size']}")
    opt = want["optimizer"]
    for key in ("betas", "eps", "weight_decay"):
        value = train.get(key)
        if value is None:
            problems.append(f"train.{key} not given by the import (DeepSpeed: {opt[key]})")
        elif (value != opt[key] if key == "betas" else not close(value, opt[key])):
            problems.append(f"train.{key} = {value}, DeepSpeed uses {opt[key]}")
    mode = train.get("weight_decay_mode", "decoupled")
    if mode != opt["weight_decay_mode"]:
        problems.append(f"weight decay {mode}, DeepSpeed's is {opt['weight_decay_mode']}")
    if opt["lr"] is not None and not close(train.get("lr", float("nan")), opt["lr"]):
        problems.append(f"train.lr = {train.get('lr')}, DeepSpeed uses {opt['lr']}")
    if not close(train.get("grad_clip", 1.0), want["grad_clip"]):
        problems.append(f"grad_clip = {train.get('grad_clip')}, DeepSpeed uses {want['grad_clip']}")
    if want["scheduler"] is not None:
        if train.get("schedule") != want["scheduler"]["type"]:
            problems.append(f"schedule = {train.get('schedule')}, not {want['scheduler']['type']}")
        lrs = [l["lr"] for l in steps]
        if len(lrs) != len(want["lr"]) or not all(close(a, b) for a, b in zip(lrs, want["lr"])):
            problems.append(f"lr per step {lrs}, DeepSpeed's {want['lr']}")
    return problems

for entry in expected["files"]:
    name = entry["file"]
    out_dir = os.path.join(scratch, name.replace(".json", ""))
    p = run(entry, out_dir)
    out = p.stdout + p.stderr
    open(os.path.join(scratch, name.replace(".json", ".out")), "w").write(out)
    if entry["outcome"] == "refused":
        named = f"{name}: {entry['names']}"
        if p.returncode == 0:
            failures.append(f"{name}: trained, where it must be refused naming {entry['names']}")
        elif named not in out:
            failures.append(f"{name}: refused without naming '{named}':\n{out[-800:]}")
        else:
            refused += 1
            print(f"{name}: refused, naming {entry['names']}")
        continue
    if p.returncode != 0:
        failures.append(f"{name}: did not train:\n{out[-1500:]}")
        continue
    problems = check_trained(entry, out_dir, out)
    if problems:
        failures.append(f"{name}: " + "; ".join(problems))
    else:
        trained += 1
        print(f"{name}: trains as DeepSpeed would ({entry['expect']['strategy']})")

print(f"{trained} trained as DeepSpeed would, {refused} refused naming the key, "
      f"{len(failures)} wrong")
for f in failures:
    print("WRONG:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
PY
