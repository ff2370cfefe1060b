#!/usr/bin/env python3
"""Recompute the "lr" lists of expected.json from the DeepSpeed config files, and check
every other expectation against DeepSpeed itself.

What it does, for each entry of expected.json (nothing here reads ztrain's code):
  1. Loads the file and fills its "auto" values as the Hugging Face Trainer does for the
     run in expected.json's run_toml (HF_AUTO below; world from the entry).
  2. Builds deepspeed.runtime.config.DeepSpeedConfig from it with the entry's world size
     (batch triple, fp16/bf16, ZeRO stage and offload, gradient_clipping; DeepSpeed's own
     errors come from here).
  3. Resolves the optimizer the way DeepSpeedEngine._configure_basic_optimizer does (the
     max_grad_norm check, _is_supported_optimizer, adam_w_mode / torch_adam /
     get_optimizer_configuration), and reads lr, betas, eps, weight_decay from the chosen
     class's __init__ signature bound to the config's params (FusedAdam, DeepSpeedCPUAdam,
     torch.optim.AdamW/Adam, ...). The class is not constructed (FusedAdam needs a GPU).
     With no "optimizer" section the Hugging Face Trainer builds its own AdamW from the run.
  4. Runs the real scheduler class from deepspeed.runtime.lr_schedules (or
     torch.optim.lr_scheduler, as DeepSpeedEngine._scheduler_from_config falls back to) on
     a torch.optim.AdamW(lr=<optimizer lr>) with the engine's order:
         sched = Cls(optimizer, **params)          # constructor writes the first lr
         for step in 1..6: record param_groups[0]['lr']; optimizer.step(); sched.step()
     (DeepSpeedEngine._take_model_step: optimizer.step(), then lr_scheduler.step() when the
     step was applied; every step is assumed applied, i.e. no fp16 overflow).
  5. Compares with the entry: "trains" entries must match what DeepSpeed does; "refused"
     entries must either make DeepSpeed raise, or use something ztrain does not have
     (an optimizer other than Adam/AdamW, L2 Adam with non-zero weight decay, OneCycle's
     momentum cycle, a scheduler outside DeepSpeed's five) under the named key.

Usage (from the repository root):
    /work/shared/peers/setup_venv.sh /tmp/dsvenv     # once: torch + DeepSpeed
    source /tmp/dsvenv/env.sh
    python tests/data/deepspeed/make_expected_lr.py          # rewrite lr lists + "deepspeed" notes, then check
    python tests/data/deepspeed/make_expected_lr.py --check  # only check, write nothing
Exit status 1 on any mismatch. Written against deepspeed 0.19.8, torch 2.15.0.
"""

import copy
import inspect
import json
import logging
import os
import re
import sys
import types

import torch
import deepspeed
import deepspeed.runtime.config as ds_config_mod
from deepspeed.runtime import lr_schedules
from deepspeed.runtime.config import DeepSpeedConfig, DEEPSPEED_OPTIMIZERS, TORCH_ADAM_PARAM, ADAM_W_MODE, \
    ADAM_W_MODE_DEFAULT, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, ADAGRAD_OPTIMIZER, LAMB_OPTIMIZER, LION_OPTIMIZER
from deepspeed.runtime.engine import DeepSpeedEngine
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected.json")
STEPS = 6

# The run of expected.json's run_toml, as the Hugging Face Trainer's TrainingArguments.
RUN = dict(steps=6, lr=0.0005, warmup_steps=2, micro_batch_size=2, grad_accum=1, weight_decay=0.1,
           betas=[0.9, 0.95], eps=1e-8, grad_clip=1.0, fp16=False, bf16=False)
RUN_OPTIMIZER = {"lr": RUN["lr"], "betas": RUN["betas"], "eps": RUN["eps"], "weight_decay": RUN["weight_decay"]}
DS_SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest")


def hf_auto(world):
    """transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process/_finalize."""
    return {
        "train_micro_batch_size_per_gpu": RUN["micro_batch_size"],
        "gradient_accumulation_steps": RUN["grad_accum"],
        "train_batch_size": world * RUN["micro_batch_size"] * RUN["grad_accum"],
        "gradient_clipping": RUN["grad_clip"],
        "optimizer.params.lr": RUN["lr"],
        "optimizer.params.betas": list(RUN["betas"]),
        "optimizer.params.eps": RUN["eps"],
        "optimizer.params.weight_decay": RUN["weight_decay"],
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": RUN["lr"],
        "scheduler.params.warmup_num_steps": RUN["warmup_steps"],
        "scheduler.params.total_num_steps": RUN["steps"],
        "fp16.enabled": RUN["fp16"],
        "bf16.enabled": RUN["bf16"],
    }


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise ValueError(f"duplicate keys {sorted(dup)}")
    return dict(pairs)


def fill_auto(cfg, world):
    table = hf_auto(world)
    if cfg.get("train_batch_size") == "auto":
        # HF fills train_batch_size from its own arguments; a file mixing it with explicit
        # micro/accum values would be a mismatch HF itself rejects. Keep the corpus clean.
        assert cfg.get("train_micro_batch_size_per_gpu", "auto") == "auto"
        assert cfg.get("gradient_accumulation_steps", "auto") == "auto"
    unresolved = []

    def walk(node, path):
        for k, v in list(node.items()):
            p = f"{path}.{k}" if path else k
            if isinstance(v, dict):
                walk(v, p)
            elif v == "auto":
                if p in table:
                    node[k] = copy.deepcopy(table[p])
                elif not p.startswith("zero_optimization."):
                    unresolved.append(p)
                # zero_optimization bucket sizes: HF fills them from the model's hidden size;
                # DeepSpeedConfigModel drops remaining "auto" values. Neither changes the outcome.

    out = copy.deepcopy(cfg)
    walk(out, "")
    if unresolved:
        raise AssertionError(f"'auto' the Hugging Face Trainer does not fill: {unresolved}")
    return out


def ds_config(cfg, world):
    # DeepSpeedConfig asks deepspeed.comm for rank and world size; answer as rank 0 of `world`.
    real = ds_config_mod.dist
    ds_config_mod.dist = types.SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, **k: world)
    try:
        return DeepSpeedConfig(copy.deepcopy(cfg))
    finally:
        ds_config_mod.dist = real


def strategy_of(c):
    z = c.zero_config
    stage = int(z.stage)
    opt_dev = z.offload_optimizer.device if z.offload_optimizer is not None else OffloadDeviceEnum.none
    par_dev = z.offload_param.device if z.offload_param is not None else OffloadDeviceEnum.none
    if stage >= 1 and stage == 3 and opt_dev == OffloadDeviceEnum.nvme:
        return "nvme_offload"
    if stage >= 1 and (opt_dev == OffloadDeviceEnum.cpu or (stage == 3 and par_dev == OffloadDeviceEnum.cpu)):
        return "cpu_offload"
    return {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]


def optimizer_of(c):
    """Returns (class name, {lr, betas, eps, weight_decay}, decoupled) or raises as DeepSpeed would."""
    name = c.optimizer_name
    if name is None:
        return "Hugging Face Trainer's torch.optim.AdamW", dict(RUN_OPTIMIZER), True
    # DeepSpeedEngine._do_sanity_check
    assert DeepSpeedEngine._is_supported_optimizer(None, name), f"{name} is not a supported DeepSpeed Optimizer"
    # DeepSpeedEngine._configure_basic_optimizer
    params = dict(c.optimizer_params or {})
    if "max_grad_norm" in params:
        raise ValueError("'max_grad_norm' is not supported as an optimizer parameter, please switch to using the "
                         "deepspeed parameter 'gradient_clipping'")
    use_cpu = c.zero_config.offload_optimizer is not None and c.zero_config.offload_optimizer.device in (
        OffloadDeviceEnum.cpu, OffloadDeviceEnum.nvme)
    decoupled = None
    if name in (ADAM_OPTIMIZER, ADAMW_OPTIMIZER):
        adam_w_mode = params.pop(ADAM_W_MODE, ADAM_W_MODE_DEFAULT)
        decoupled = bool(name == ADAMW_OPTIMIZER or adam_w_mode)
        fake_engine = types.SimpleNamespace(zero_use_cpu_optimizer=lambda: use_cpu,
                                            bf16_optimizer_states=lambda: c.bfloat16_config.bf16_optimizer_states,
                                            zenflow=False)
        cls, kwargs = DeepSpeedEngine.get_optimizer_configuration(fake_engine, params, decoupled)
    elif name == ADAGRAD_OPTIMIZER:
        if use_cpu:
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad as cls
        else:
            cls = torch.optim.Adagrad
        kwargs = {}
    elif name == LAMB_OPTIMIZER:
        from deepspeed.ops.lamb import FusedLamb as cls
        kwargs = {}
    elif name == LION_OPTIMIZER:
        from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
        cls, kwargs = (DeepSpeedCPULion if use_cpu else FusedLion), {}
    elif name.lower() in DEEPSPEED_OPTIMIZERS:
        raise NotImplementedError(f"optimizer {name} is not modelled here")
    else:
        cls, kwargs = getattr(torch.optim, name), {}
    bound = inspect.signature(cls.__init__).bind(None, [], **params, **kwargs)  # TypeError as the constructor
    bound.apply_defaults()
    a = bound.arguments
    if decoupled is None and cls is torch.optim.AdamW:
        decoupled = True
    vals = {"lr": a.get("lr"), "betas": list(a["betas"]) if "betas" in a else None, "eps": a.get("eps"),
            "weight_decay": a.get("weight_decay")}
    return f"{cls.__module__}.{cls.__qualname__}", vals, decoupled


def scheduler_class(name):
    if hasattr(lr_schedules, name):
        return getattr(lr_schedules, name)
    assert hasattr(torch.optim.lr_scheduler, name), f"DeepSpeed does not recognize LR scheduler {name}"
    return getattr(torch.optim.lr_scheduler, name)


def run_schedule(cls, params, opt_vals):
    """The engine's order. Returns (lr list, betas changed?)."""
    p = torch.nn.Parameter(torch.zeros(4))
    betas = tuple(opt_vals["betas"] or (0.9, 0.999))
    opt = torch.optim.AdamW([p], lr=opt_vals["lr"], betas=betas, eps=opt_vals["eps"] or 1e-8,
                            weight_decay=opt_vals["weight_decay"] or 0.0)
    if params is None:  # "scheduler" without "params": the engine's **None
        raise TypeError(f"{cls.__name__}() argument after ** must be a mapping, not NoneType")
    sched = cls(opt, **params)
    lrs, moved = [], False
    for _ in range(STEPS):
        g = opt.param_groups[0]
        lrs.append(float(g["lr"]))
        moved |= tuple(g["betas"]) != betas
        p.grad = torch.full_like(p, 0.5)
        opt.step()
        opt.zero_grad()
        sched.step()
    return lrs, moved


def resolved_scheduler_params(cls, params, opt_lr):
    bound = inspect.signature(cls.__init__).bind(None, None, **params)
    bound.apply_defaults()
    a = dict(bound.arguments)
    for k in ("self", "optimizer", "last_batch_iteration"):
        a.pop(k, None)
    if cls is lr_schedules.WarmupLR and a["warmup_max_lr"] is None:
        a["warmup_max_lr"] = opt_lr  # the optimizer's own param_group lr
    if cls is lr_schedules.OneCycle:
        if a["cycle_second_step_size"] is None:
            a["cycle_second_step_size"] = a["cycle_first_step_size"]
        if a["cycle_second_stair_count"] is None:
            a["cycle_second_stair_count"] = a["cycle_first_stair_count"]
    return a


def evaluate(path, world):
    """What DeepSpeed does with this file in this run: dict, with "error" when DeepSpeed raises,
    and "unsupported" (key, reason) for what ztrain does not have."""
    with open(path) as f:
        raw = json.load(f, object_pairs_hook=no_duplicates)
    res = {"unsupported": []}
    try:
        cfg = fill_auto(raw, world)
        c = ds_config(cfg, world)
        precision = "fp16" if c.float16_config.enabled else ("bf16" if c.bfloat16_config.enabled else "fp32")
        res.update(strategy=strategy_of(c), precision=precision, global_batch_size=c.train_batch_size,
                   micro_batch_size=c.train_micro_batch_size_per_gpu, grad_accum=c.gradient_accumulation_steps,
                   grad_clip=c.gradient_clipping)
        cls_name, ov, decoupled = optimizer_of(c)
        res["optimizer_class"] = cls_name
        if c.optimizer_name is not None and c.optimizer_name not in (ADAM_OPTIMIZER, ADAMW_OPTIMIZER):
            res["unsupported"].append(("optimizer.type", f"DeepSpeed builds {cls_name}"))
        if decoupled is False and ov["weight_decay"]:
            res["unsupported"].append(("optimizer.params.adam_w_mode", f"{cls_name} with L2 weight decay"))
        sched = None
        lrs = None
        if c.scheduler_name is not None:
            scls = scheduler_class(c.scheduler_name)
            built_lr = ov["lr"]  # the lr the optimizer is built with, before the scheduler
            lrs, moved = run_schedule(scls, c.scheduler_params, ov)
            lrs_other, _ = run_schedule(scls, c.scheduler_params, dict(ov, lr=built_lr * 3.0 + 1e-3))
            if lrs_other == lrs:
                ov["lr"] = None  # the scheduler sets the lr itself, whatever the optimizer's
            if c.scheduler_name not in DS_SCHEDULERS:
                res["unsupported"].append(("scheduler.type", f"torch.optim.lr_scheduler.{c.scheduler_name}"))
            if moved:
                res["unsupported"].append(("scheduler.params.cycle_momentum", "the scheduler moves Adam's betas"))
            sched = {"type": c.scheduler_name,
                     "params": resolved_scheduler_params(scls, c.scheduler_params, built_lr)}
        res.update(optimizer=ov, scheduler=sched, lr=lrs)
    except Exception as e:  # noqa: BLE001 - DeepSpeed's own refusal is an expected outcome
        msg = str(e).strip().splitlines()
        res["error"] = f"{type(e).__name__}: {' '.join(s.strip() for s in msg)[:300]}"
    return res


def same(a, b):
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return a == b


def dump(doc):
    text = json.dumps(doc, indent=2)
    # keep number lists (lr, betas) on one line
    text = re.sub(r"\[\s+([-0-9.eE+,\s]+?)\s+\]", lambda m: "[" + ", ".join(s.strip() for s in m.group(1).split(",")) + "]",
                  text)
    return text + "\n"


def main():
    check_only = "--check" in sys.argv[1:]
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    with open(EXPECTED) as f:
        doc = json.load(f)
    problems = []
    listed = sorted(e["file"] for e in doc["files"])
    present = sorted(n for n in os.listdir(HERE) if n.endswith(".json") and n != "expected.json")
    if listed != present:
        problems.append(f"files on disk and in expected.json differ: {sorted(set(listed) ^ set(present))}")
    for e in doc["files"]:
        got = evaluate(os.path.join(HERE, e["file"]), e["world"])
        where = f"{e['file']} (world {e['world']})"
        if e["outcome"] == "trains":
            if "error" in got:
                problems.append(f"{where}: DeepSpeed raises {got['error']}")
                continue
            if got["unsupported"]:
                problems.append(f"{where}: uses what ztrain lacks: {got['unsupported']}")
            x = e["expect"]
            if not check_only:
                x["lr"] = got["lr"]
            for k in ("strategy", "precision", "global_batch_size", "micro_batch_size", "grad_accum", "optimizer",
                      "grad_clip", "scheduler", "lr"):
                if not same(x.get(k), got[k]):
                    problems.append(f"{where}: {k} expected {json.dumps(x.get(k))}, DeepSpeed gives {json.dumps(got[k])}")
        else:
            if "error" in got:
                note = got["error"]
                leaf = e["names"].split(".")[-1]
                if leaf.lower() not in note.lower():
                    print(f"note: {where}: DeepSpeed's message does not name '{leaf}': {note}")
            else:
                keys = [k for k, _ in got["unsupported"]]
                if e["names"] not in keys:
                    problems.append(f"{where}: refused as {e['names']}, but DeepSpeed accepts it "
                                    f"and nothing ztrain lacks is used there (found {keys})")
                note = "accepts; " + "; ".join(f"{k}: {r}" for k, r in got["unsupported"])
            if check_only:
                if e.get("deepspeed") != note:
                    problems.append(f"{where}: deepspeed note is {e.get('deepspeed')!r}, now {note!r}")
            else:
                e["deepspeed"] = note
    if not check_only:
        with open(EXPECTED, "w") as f:
            f.write(dump(doc))
        print(f"wrote {EXPECTED}")
    n_tr = sum(e["outcome"] == "trains" for e in doc["files"])
    print(f"{len(doc['files'])} files: {n_tr} trains, {len(doc['files']) - n_tr} refused; "
          f"deepspeed {deepspeed.__version__}, torch {torch.__version__}")
    for p in problems:
        print("MISMATCH", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
