#!/usr/bin/env python3
"""Golden learning-rate tables for ztrain's DeepSpeed-compatible LR schedulers.

What it does
    Builds every case of the grid below with DeepSpeed's own scheduler classes
    (deepspeed.runtime.lr_schedules) driving a real torch.optim.AdamW, and writes
    deepspeed.json next to this file: for each case the lr of param_groups[0] (and,
    for OneCycle with cycle_momentum, betas[0]) at the moment optimizer.step() is
    called for optimizer steps 1..N, or the exception DeepSpeed raises for that config.
    Only deepspeed.runtime.lr_schedules and torch are imported; no engine, no
    accelerator, no process group. Output is deterministic (pure Python float math;
    the AdamW step does not touch param_groups' lr/betas).

How to rerun
    /work/shared/peers/setup_venv.sh /tmp/dsvenv     # once (torch + DeepSpeed from PyPI)
    source /tmp/dsvenv/env.sh
    python tests/data/lr_schedules/make_golden.py    # from the repository root
    The script checks the installed classes' __init__ signatures against the lists
    below and stops if they differ (a different DeepSpeed may behave differently).

Versions used for the committed deepspeed.json
    deepspeed 0.19.8, torch 2.15.0+cu132 (CPU use), Python 3.11.7 (also stored in the JSON).

Engine order emulated (checked in deepspeed/runtime/engine.py of 0.19.8)
    DeepSpeedEngine._configure_lr_scheduler -> _scheduler_from_config builds the
    scheduler as `getattr(lr_schedules, type)(optimizer, **scheduler_params)` over the
    already constructed optimizer, with the config's "scheduler": {"params": ...} dict
    verbatim (last_batch_iteration stays at its default -1; the constructors then write
    their initial lr into the param groups). DeepSpeedEngine.step -> _take_model_step
    calls self.optimizer.step(), zeroes grads, and then, only when the step was applied
    (no fp16 overflow), self.lr_scheduler.step(**(lr_kwargs or {})), i.e. step() with no
    arguments by default. So the lr used by optimizer step k is the one left by the
    constructor (k = 1) or by the (k-1)-th scheduler.step(). This script does:
        opt = AdamW([p], lr=optimizer_lr, betas=(0.9, 0.999)); sched = Cls(opt, **params)
        for k in 1..N: record lr (and beta1); opt.step(); sched.step()
    If "params" is absent from the config, scheduler_params() is None and the engine's
    `**None` raises TypeError; case "warmup_params_key_missing" records that
    (its "params" is null).

Scheduler parameters and defaults (deepspeed 0.19.8 __init__, besides optimizer and
last_batch_iteration=-1):
    WarmupLR:       warmup_min_lr=0.0, warmup_max_lr=None (None: the optimizer's own
                    param_group lr; the docstring's "0.001" is wrong), warmup_num_steps=1000,
                    warmup_type='log'
    WarmupDecayLR:  total_num_steps (required), warmup_min_lr=0.0, warmup_max_lr=0.001,
                    warmup_num_steps=1000, warmup_type='log'
    WarmupCosineLR: total_num_steps (required), warmup_min_ratio=0.0, warmup_num_steps=1000,
                    cos_min_ratio=0.0001, warmup_type='log'
    OneCycle:       cycle_min_lr (required), cycle_max_lr (required), decay_lr_rate=0.0,
                    cycle_first_step_size=2000, cycle_second_step_size=None (-> first),
                    cycle_first_stair_count=0, cycle_second_stair_count=None (-> first
                    stair count), decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8,
                    cycle_max_mom=0.9, decay_mom_rate=0.0
    LRRangeTest:    lr_range_test_min_lr=0.001, lr_range_test_step_size=2000,
                    lr_range_test_step_rate=1.0, lr_range_test_staircase=False

Behaviour worth knowing (all visible in the tables)
    * WarmupLR/WarmupDecayLR/WarmupCosineLR: warmup_num_steps must be an int > 0
      (0, negative or a float such as 5.0 -> ValueError); it is then raised to max(2, n).
      An unknown warmup_type logs a warning and falls back to 'log'.
    * Iteration i = k - 2 drives optimizer step k (constructor leaves i = -1). At i = -1
      WarmupLR/WarmupDecayLR give warmup_min_lr and WarmupCosineLR gives lr 0.0 (not
      warmup_min_ratio * lr). At i = 0 both 'log' (log 1 = 0) and 'linear' (0/n) give the
      minimum again, so steps 1 and 2 share the minimum (WarmupCosineLR: 0, then
      warmup_min_ratio * lr).
    * WarmupDecayLR past warmup: gamma = max(0, (T - i) / max(1, T - W)); with W >= T the
      lr drops straight from the warmup value to warmup_min_lr; it stays at warmup_min_lr
      past total_num_steps.
    * WarmupCosineLR past warmup: progress = min(1, (i - W + 1) / max(1, T - W)), so with
      W >= T the ratio drops straight to cos_min_ratio, and it stays there past T.
    * OneCycle: the constructor sets lr = cycle_min_lr and betas = (cycle_min_mom, 0.99),
      and every scheduler.step() sets betas = (beta1, 0.99): beta2 of the optimizer is
      overwritten with 0.99 (not 0.999) whenever cycle_momentum is true. Step 1 pairs
      cycle_min_lr with cycle_min_mom; from step 2 on beta1 moves inversely to the lr.
      Post-cycle decay: lr = min / (1 + decay_lr_rate * d / decay_step_size) and
      beta1 = max_mom * (1 + decay_mom_rate * d / decay_step_size), d = i - total + 1;
      decay_step_size 0 disables both decays, decay_lr_rate 0 / decay_mom_rate 0 each
      disable their own. The momentum "decay" grows beta1 without bound: in
      onecycle_asym10_20_decay_mom beta1 passes 1.0 at step 58 (torch's AdamW.step does
      not check it). cycle_first_step_size <= 0 and cycle_second_step_size < 0 raise;
      cycle_second_step_size 0 is accepted and the lr then never reaches cycle_max_lr
      (it falls from the last rising value straight to cycle_min_lr).
      Stairs: lr/beta1 are held on floor(position * stairs) / stairs of each half, so the
      peak value is held for exactly one step.
    * LRRangeTest: lr_range_test_step_size must be an int > 0 (10.0 -> ValueError).
"""

import inspect
import json
import logging
import math
import os
import sys

import torch
import deepspeed
from deepspeed.runtime import lr_schedules

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "deepspeed.json")
MAX_STEPS = 400

EXPECTED_SIGNATURES = {
    "WarmupLR": [("warmup_min_lr", 0.0), ("warmup_max_lr", None), ("warmup_num_steps", 1000),
                 ("warmup_type", "log"), ("last_batch_iteration", -1)],
    "WarmupDecayLR": [("total_num_steps", inspect.Parameter.empty), ("warmup_min_lr", 0.0),
                      ("warmup_max_lr", 0.001), ("warmup_num_steps", 1000), ("warmup_type", "log"),
                      ("last_batch_iteration", -1)],
    "WarmupCosineLR": [("total_num_steps", inspect.Parameter.empty), ("warmup_min_ratio", 0.0),
                       ("warmup_num_steps", 1000), ("cos_min_ratio", 0.0001), ("warmup_type", "log"),
                       ("last_batch_iteration", -1)],
    "OneCycle": [("cycle_min_lr", inspect.Parameter.empty), ("cycle_max_lr", inspect.Parameter.empty),
                 ("decay_lr_rate", 0.0), ("cycle_first_step_size", 2000), ("cycle_second_step_size", None),
                 ("cycle_first_stair_count", 0), ("cycle_second_stair_count", None), ("decay_step_size", 0),
                 ("cycle_momentum", True), ("cycle_min_mom", 0.8), ("cycle_max_mom", 0.9),
                 ("decay_mom_rate", 0.0), ("last_batch_iteration", -1)],
    "LRRangeTest": [("lr_range_test_min_lr", 0.001), ("lr_range_test_step_size", 2000),
                    ("lr_range_test_step_rate", 1.0), ("lr_range_test_staircase", False),
                    ("last_batch_iteration", -1)],
}


def check_signatures():
    for name, expected in EXPECTED_SIGNATURES.items():
        params = list(inspect.signature(getattr(lr_schedules, name).__init__).parameters.values())[2:]
        got = [(p.name, p.default) for p in params]
        if got != expected:
            sys.exit(f"{name}.__init__ signature changed:\n  got      {got}\n  expected {expected}")


# ---------------------------------------------------------------- the grid
CASES = []
NAMES = set()


def add(name, type_, params, optimizer_lr, steps=None):
    assert name not in NAMES, name
    NAMES.add(name)
    CASES.append(dict(name=name, type=type_, params=params, optimizer_lr=optimizer_lr, steps=steps))


def fmt(x):
    return {0: "0", 1e-8: "1e-8", 1e-4: "1e-4", 1e-3: "1e-3", 3e-4: "3e-4", 5e-4: "5e-4"}.get(x, repr(x))


def eff_warmup(w):
    return max(2, w)


LR_PAIRS = [(0, 1e-3), (1e-8, 3e-4), (1e-4, 1e-3), (0, 3e-4), (1e-8, 1e-3), (1e-4, 3e-4)]
TYPES = ["log", "linear", None]  # None: key omitted (DeepSpeed default 'log')


def warmup_params(wtype, mn, mx, w, extra=None):
    p = dict(extra or {})
    p.update(warmup_min_lr=mn, warmup_max_lr=mx, warmup_num_steps=w)
    if wtype is not None:
        p["warmup_type"] = wtype
    return p


def tname(wtype):
    return wtype or "deftype"


def build_grid():
    # ---- WarmupLR: lr reaches max by iteration W, i.e. optimizer step W + 2.
    for ti, wtype in enumerate(TYPES):
        for wi, w in enumerate([1, 5, 10, 100]):
            for k in (0, 3):
                mn, mx = LR_PAIRS[(ti * 4 + wi + k) % 6]
                add(f"warmup_{tname(wtype)}_w{w}_min{fmt(mn)}_max{fmt(mx)}", "WarmupLR",
                    warmup_params(wtype, mn, mx, w), 1e-3, eff_warmup(w) + 2 + 5)
        add(f"warmup_{tname(wtype)}_w0", "WarmupLR", warmup_params(wtype, 0, 1e-3, 0), 1e-3)
    add("warmup_no_params", "WarmupLR", {}, 1e-3, MAX_STEPS)  # warmup 1000 > 400: only warmup is seen
    add("warmup_params_key_missing", "WarmupLR", None, 1e-3)
    add("warmup_max_omitted_optlr5e-4", "WarmupLR",
        {"warmup_min_lr": 1e-5, "warmup_num_steps": 10, "warmup_type": "linear"}, 5e-4, 17)
    add("warmup_unknown_type_cosine", "WarmupLR", warmup_params("cosine", 0, 1e-3, 10), 1e-3, 17)
    add("warmup_w_float", "WarmupLR", warmup_params("linear", 0, 1e-3, 5.0), 1e-3)
    add("warmup_w_negative", "WarmupLR", warmup_params("log", 0, 1e-3, -3), 1e-3)

    # ---- WarmupDecayLR: N = total + 10, or past the warmup when it is longer.
    decay_grid = [(10, 1), (10, 5), (10, 10), (10, 100), (20, 5), (20, 10), (20, 20), (20, 100),
                  (150, 1), (150, 5), (150, 10), (150, 100), (150, 150), (150, 200)]
    i = 0
    for t, w in decay_grid:
        for k in (0, 1):
            wtype = TYPES[(i + k) % 3]
            mn, mx = LR_PAIRS[(i + 2 * k) % 6]
            steps = min(MAX_STEPS, max(t + 10, eff_warmup(w) + 2 + 5))
            add(f"decay_t{t}_w{w}_{tname(wtype)}_min{fmt(mn)}_max{fmt(mx)}", "WarmupDecayLR",
                warmup_params(wtype, mn, mx, w, {"total_num_steps": t}), 1e-3, steps)
        i += 1
    add("decay_t20_w0", "WarmupDecayLR", warmup_params("linear", 0, 1e-3, 0, {"total_num_steps": 20}), 1e-3)
    add("decay_no_params", "WarmupDecayLR", {}, 1e-3)  # total_num_steps is required
    add("decay_only_total20", "WarmupDecayLR", {"total_num_steps": 20}, 3e-4, MAX_STEPS)  # warmup 1000 > 20
    add("decay_only_total150_w10", "WarmupDecayLR", {"total_num_steps": 150, "warmup_num_steps": 10}, 3e-4, 160)

    # ---- WarmupCosineLR: scales the optimizer's own lr.
    i = 0
    for t in (20, 150):
        for w in (5, 10):
            for wtype in ("log", "linear"):
                for wmin in (0, 0.1):
                    cmin = [None, 0.0001, 0.1][i % 3]  # None: key omitted (default 0.0001)
                    optlr = [1e-3, 3e-4][(i // 3) % 2]
                    p = {"total_num_steps": t, "warmup_num_steps": w, "warmup_min_ratio": wmin,
                         "warmup_type": wtype}
                    if cmin is not None:
                        p["cos_min_ratio"] = cmin
                    add(f"cosine_t{t}_w{w}_{wtype}_wmin{wmin}_cmin{'def' if cmin is None else cmin}_lr{fmt(optlr)}",
                        "WarmupCosineLR", p, optlr, min(MAX_STEPS, t + 10))
                    i += 1
    for t, w, wtype, optlr in [(20, 20, "linear", 1e-3), (20, 30, "log", 1e-3), (20, 30, "linear", 3e-4),
                               (10, 100, "linear", 1e-3)]:
        p = {"total_num_steps": t, "warmup_num_steps": w, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.1,
             "warmup_type": wtype}
        add(f"cosine_t{t}_w{w}_{wtype}_lr{fmt(optlr)}", "WarmupCosineLR", p, optlr, max(t + 10, w + 2 + 5))
    add("cosine_t150_w1_typeomitted", "WarmupCosineLR", {"total_num_steps": 150, "warmup_num_steps": 1}, 1e-3, 160)
    add("cosine_t20_w0_log", "WarmupCosineLR",
        {"total_num_steps": 20, "warmup_num_steps": 0, "warmup_type": "log"}, 1e-3)
    add("cosine_t20_w0_linear", "WarmupCosineLR",
        {"total_num_steps": 20, "warmup_num_steps": 0, "warmup_type": "linear", "warmup_min_ratio": 0.1}, 1e-3)
    add("cosine_only_total150", "WarmupCosineLR", {"total_num_steps": 150}, 1e-3, MAX_STEPS)  # warmup 1000
    add("cosine_no_params", "WarmupCosineLR", {}, 1e-3)  # total_num_steps is required

    # ---- OneCycle
    oc = [
        ("onecycle_sym10_mom", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10}, 30),
        ("onecycle_asym10_20_decay_mom", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "decay_lr_rate": 0.1,
                                          "cycle_first_step_size": 10, "cycle_second_step_size": 20,
                                          "decay_step_size": 5, "cycle_momentum": True, "cycle_min_mom": 0.85,
                                          "cycle_max_mom": 0.95, "decay_mom_rate": 0.01}, 60),
        ("onecycle_stairs4_nomom", {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3, "cycle_first_step_size": 20,
                                    "cycle_first_stair_count": 4, "cycle_momentum": False}, 50),
        ("onecycle_stairs3_2_decay_mom", {"cycle_min_lr": 2e-4, "cycle_max_lr": 2e-3, "decay_lr_rate": 0.5,
                                          "cycle_first_step_size": 12, "cycle_second_step_size": 18,
                                          "cycle_first_stair_count": 3, "cycle_second_stair_count": 2,
                                          "decay_step_size": 4, "cycle_momentum": True,
                                          "cycle_min_mom": 0.8, "cycle_max_mom": 0.9,
                                          "decay_mom_rate": 0.005}, 60),
        ("onecycle_stairs3_uneven_mom", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 10,
                                         "cycle_second_step_size": 7, "cycle_first_stair_count": 3,
                                         "cycle_second_stair_count": 0}, 30),
        ("onecycle_decayrate_stepsize0_nomom", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "decay_lr_rate": 0.2,
                                                "cycle_first_step_size": 8, "decay_step_size": 0,
                                                "cycle_momentum": False}, 25),
        ("onecycle_lrrate0_momdecay", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "decay_lr_rate": 0.0,
                                       "cycle_first_step_size": 6, "cycle_second_step_size": 4,
                                       "decay_step_size": 3, "cycle_momentum": True,
                                       "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
                                       "decay_mom_rate": 0.005}, 30),
        ("onecycle_second0_decay", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "decay_lr_rate": 0.1,
                                    "cycle_first_step_size": 10, "cycle_second_step_size": 0,
                                    "decay_step_size": 2, "cycle_momentum": True}, 25),
        ("onecycle_defaults", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}, MAX_STEPS),  # first step 2000
        ("onecycle_first0", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 0}, None),
        ("onecycle_second_negative", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5,
                                      "cycle_second_step_size": -1}, None),
        ("onecycle_missing_max_lr", {"cycle_min_lr": 1e-4}, None),
    ]
    for name, p, n in oc:
        add(name, "OneCycle", p, 1e-3, n)

    # ---- LRRangeTest
    rt = [
        ("rangetest_defaults", {}, MAX_STEPS),
        ("rangetest_s10_r1_cont", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 10,
                                   "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": False}, 35),
        ("rangetest_s10_r1_stair", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 10,
                                    "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": True}, 35),
        ("rangetest_s5_r0.5_stair", {"lr_range_test_min_lr": 1e-5, "lr_range_test_step_size": 5,
                                     "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": True}, 25),
        ("rangetest_s7_r5_cont", {"lr_range_test_min_lr": 1e-5, "lr_range_test_step_size": 7,
                                  "lr_range_test_step_rate": 5.0}, 26),
        ("rangetest_s1_r2_stair", {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 1,
                                   "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": True}, 10),
        ("rangetest_s0", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 0}, None),
        ("rangetest_s_float", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 10.0}, None),
    ]
    for name, p, n in rt:
        add(name, "LRRangeTest", p, 1e-3, n)


# ---------------------------------------------------------------- running
def run_case(c):
    out = {"name": c["name"], "type": c["type"], "params": c["params"], "optimizer_lr": c["optimizer_lr"]}
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([p], lr=c["optimizer_lr"], betas=(0.9, 0.999))
    cls = getattr(lr_schedules, c["type"])
    want_beta1 = c["type"] == "OneCycle" and (c["params"] or {}).get("cycle_momentum", True)
    try:
        # as DeepSpeedEngine._scheduler_from_config: scheduler(optimizer, **scheduler_params)
        sched = cls(opt, **c["params"])
        lrs, beta1 = [], []
        for _ in range(c["steps"]):
            g = opt.param_groups[0]
            lrs.append(float(g["lr"]))
            beta1.append(float(g["betas"][0]))
            if want_beta1:
                assert g["betas"][1] == 0.99, g["betas"]
            else:
                assert tuple(g["betas"]) == (0.9, 0.999), g["betas"]
            p.grad = torch.full_like(p, 0.5)
            opt.step()
            opt.zero_grad()
            sched.step()
    except Exception as e:  # noqa: BLE001 - recorded as the expected outcome
        assert c["steps"] is None, f"{c['name']} raised unexpectedly: {e!r}"
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    assert c["steps"] is not None and c["steps"] <= MAX_STEPS, f"{c['name']} did not raise"
    out["steps"] = c["steps"]
    out["lr"] = lrs
    if want_beta1:
        out["beta1"] = beta1
    return out


def main():
    check_signatures()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # "lr before scheduler started" etc.
    build_grid()
    results = [run_case(c) for c in CASES]
    head = {"generator": "tests/data/lr_schedules/make_golden.py", "deepspeed": deepspeed.__version__,
            "torch": torch.__version__}
    text = json.dumps(head)[:-1] + ',\n "cases": [\n'
    text += ",\n".join(json.dumps(r, separators=(",", ":"), allow_nan=False) for r in results)
    text += "\n]}\n"
    json.loads(text)
    with open(OUT, "w") as f:
        f.write(text)
    counts = {}
    for r in results:
        counts.setdefault(r["type"], [0, 0])[("error" in r)] += 1
    print(f"wrote {OUT}: {len(results)} cases, {len(text)} bytes; per type [ok, error]: {counts}")


if __name__ == "__main__":
    main()
