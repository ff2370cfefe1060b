#!/usr/bin/env python3
"""Cross-check ztrain's GPT-2 and Llama against Hugging Face transformers.

For each model configuration this script

1. writes random llm.c token files (train and val) into a temporary directory;
2. trains the model with ztrain for a few steps (lr 1e-2, so the weights move
   well away from their initialisation) with the `tokens` data plugin and an
   evaluation at the last step;
3. loads ztrain's out_dir with transformers (AutoModelForCausalLM, float32,
   eager attention), computes the loss over exactly the val sequences ztrain
   evaluated, averaged exactly as ztrain averages it, and compares it with
   ztrain's final val loss;
4. saves the transformers model again with save_pretrained and points ztrain
   at that directory (`--set model.init_from=DIR --set train.steps=1
   --set train.lr=0 --set train.min_lr=0`): the import of files written by
   transformers itself, evaluated on the original val file and on several
   other random single-batch val files;
5. recovers per-token quantities from ztrain's CLI, which prints only a mean
   loss:
   - per-position losses ("prefix" check): the model is re-run with
     seq_len = t for t = 1..T on a val file holding one sequence; the mean
     loss over the first t positions is L_t, so the loss at position t-1 is
     t*L_t - (t-1)*L_{t-1}. Llama has no parameter that depends on seq_len;
     for GPT-2 the script writes a copy of the weights whose wpe keeps only
     the first t rows (positions 0..t-1 use exactly those rows).
   - last-position logits ("logit" check): the val file holds one sequence
     and only its last token, which is a target and never an input, is
     varied over P vocabulary entries. T*L(v) = S + nll_last(v) with S the
     same for every v, so T*(L(v) - L(v0)) = logit(v0) - logit(v); these
     logit differences are compared with transformers' logits. With P =
     vocab_size (--logit-probes all) the whole log-softmax at that position
     is recovered (S = -logsumexp(-T*L)).

Cases with a non-default norm_eps or rope_theta also print "sensitivity" rows:
the HF loss with that one setting put back to its default, which must differ
from ztrain's loss by far more than the ztrain/HF difference (otherwise the
row is flagged NOT DISCRIMINATING): that shows the setting is honoured.

It prints a table: config, check, ztrain value, HF value, absolute difference
(and, for rows comparing two float32 losses, the difference in float32 ulps),
and exits non-zero if any difference is above --tol (default 1e-4).

Resolution: ztrain reports losses as float32, so a loss compares to about one
ulp (4.8e-7 near 5.5); quantities derived by multiplying a mean by T (the
per-token losses and logit differences) carry up to T*ulp of rounding
(about 1.5e-5 at T = 32), printed as "resolution" beside them.

It is a development tool (it needs torch and transformers), not part of CI:

    python3 -m venv /work/venv-hf
    /work/venv-hf/bin/pip install torch transformers safetensors numpy
    /work/venv-hf/bin/python tools/hf_crosscheck.py [--ztrain PATH/bin/ztrain]

The ztrain binary defaults to /tmp/ztrain-snapshot/bin/ztrain; its libraries
are looked up in ../lib beside the binary (override with --lib) and put on
LD_LIBRARY_PATH for the subprocess only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAGIC_U16 = 20240520


# --------------------------------------------------------------------------
# configurations


@dataclass
class Case:
    name: str
    model: dict  # the [model] table of the run file
    # HF config overrides, each undoing one non-default setting: the loss
    # computed with it shows how much that setting matters (the check only
    # proves the setting is honoured if this is well above the ztrain/HF
    # difference).
    sensitivity: list = field(default_factory=list)


# init_std 0.2 (not 0.02): attention far from uniform, so positions (rope_theta) matter
SHAPE = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=256, seq_len=32, init_std=0.2)

CASES = [
    Case("gpt2", dict(arch="gpt2", **SHAPE)),
    Case("gpt2-eps1e-3", dict(arch="gpt2", norm_eps=1e-3, **SHAPE),
         sensitivity=[{"layer_norm_epsilon": 1e-5}]),
    Case("llama-gqa", dict(arch="llama", n_kv_head=2, **SHAPE)),
    Case("llama-theta5e4-eps1e-6",
         dict(arch="llama", n_kv_head=2, rope_theta=50000.0, norm_eps=1e-6,
              intermediate_size=160, **SHAPE),
         sensitivity=[{"rope_theta": 10000.0}, {"rms_norm_eps": 1e-5}]),
    Case("llama-mqa-theta100-eps1e-3",
         dict(arch="llama", n_kv_head=1, rope_theta=100.0, norm_eps=1e-3, **SHAPE),
         sensitivity=[{"rope_theta": 10000.0}, {"rms_norm_eps": 1e-5}]),
]


# --------------------------------------------------------------------------
# token files


def write_tokens(path: Path, tokens: np.ndarray) -> None:
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = MAGIC_U16, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def val_windows(tokens: np.ndarray, T: int, B: int, eval_batches: int):
    """The (inputs, targets) of each val micro-batch, as ztrain's loader and
    the tokens plugin (shuffle never applies to val) build them: sequence i is
    window i mod count, window w = tokens[w*T : w*T+T+1], count = (n-1)//T."""
    count = (len(tokens) - 1) // T
    batches = []
    for j in range(eval_batches):
        rows = [((j * B + b) % count) * T for b in range(B)]
        x = np.stack([tokens[s:s + T] for s in rows]).astype(np.int64)
        y = np.stack([tokens[s + 1:s + T + 1] for s in rows]).astype(np.int64)
        batches.append((x, y))
    return batches


# --------------------------------------------------------------------------
# ztrain


class Ztrain:
    def __init__(self, binary: Path, lib: Path, work: Path, threads: int, verbose: bool):
        self.binary, self.work, self.verbose = binary, work, verbose
        self.env = dict(os.environ)
        ld = self.env.get("LD_LIBRARY_PATH")
        self.env["LD_LIBRARY_PATH"] = str(lib) + (":" + ld if ld else "")
        self.threads = threads
        self.runs = 0
        self.split_bug_seen = False
        self.seconds = 0.0

    def run(self, model: dict, train: Path, val: Path, out_dir: Path, *, steps: int,
            lr: float, min_lr: float, micro_batch: int, eval_batches: int,
            sets: list[str] = ()) -> float:
        """Runs ztrain and returns its final val loss (from metrics.jsonl)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        run_file = out_dir / "run.toml"
        lines = ["[model]", 'plugin = "transformer"']
        for k, v in model.items():
            lines.append(f"{k} = {toml_value(v)}")
        lines += [
            "", "[data]", 'plugin = "tokens"', f"path = {toml_value(str(train))}",
            f"val_path = {toml_value(str(val))}", "shuffle = false",
            "", "[train]", f"steps = {steps}", f"micro_batch_size = {micro_batch}",
            "grad_accum = 1", f"lr = {lr!r}", f"min_lr = {min_lr!r}", "warmup_steps = 2",
            'schedule = "cosine"', "weight_decay = 0.1", "grad_clip = 1.0",
            'precision = "fp32"', "seed = 0", f"log_every = {max(steps, 1)}",
            f"eval_every = {steps}", f"eval_batches = {eval_batches}",
            f"out_dir = {toml_value(str(out_dir))}",
            "", "[device]", 'kind = "cpu"', f"threads = {self.threads}",
            "", "[strategy]", 'plugin = "ddp"', "",
        ]
        run_file.write_text("\n".join(lines))
        cmd = [str(self.binary)]
        for s in sets:
            cmd += ["--set", s]
        cmd.append(str(run_file))
        t0 = time.time()
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, cwd=self.work)
        self.seconds += time.time() - t0
        self.runs += 1
        if self.verbose:
            print("$", " ".join(cmd), file=sys.stderr)
            print(p.stdout, p.stderr, file=sys.stderr)
        if p.returncode != 0:
            raise RuntimeError(f"ztrain failed ({p.returncode}): {' '.join(cmd)}\n"
                               f"{p.stdout}\n{p.stderr}")
        val_losses = []
        with open(out_dir / "metrics.jsonl") as f:
            for line in f:
                rec = json.loads(line)
                split = rec.get("split")
                if split == "val":
                    val_losses.append(rec["loss"])
                elif not isinstance(split, str) and "lr" not in rec:
                    # Builds whose JsonLine::add("split", "val") picks the bool
                    # overload write "split": true on every line; an evaluation
                    # line is then the one without the training fields.
                    if not self.split_bug_seen:
                        print(f"  note: {out_dir / 'metrics.jsonl'} has \"split\": {split!r} "
                              "instead of \"val\"/\"train\" (ztrain bug); val lines found "
                              "by their missing \"lr\"", file=sys.stderr)
                        self.split_bug_seen = True
                    val_losses.append(rec["loss"])
        if not val_losses:
            raise RuntimeError(f"no val loss in {out_dir / 'metrics.jsonl'}")
        # written with %.9g from a float: exactly one float32 value
        return float(np.float32(val_losses[-1]))


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


# --------------------------------------------------------------------------
# transformers side


def load_hf(path: Path, overrides: dict | None = None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    for k, v in (overrides or {}).items():
        setattr(config, k, v)
        if k == "rope_theta" and isinstance(getattr(config, "rope_parameters", None), dict):
            config.rope_parameters["rope_theta"] = v  # transformers >= 5 keeps it here
    kwargs = dict(config=config, attn_implementation="eager", output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    except TypeError:  # transformers < 4.56 only knows torch_dtype
        model, info = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                           **kwargs)
    bad = {k: v for k, v in info.items() if v}
    # GPT-2's lm_head is tied to wte and never stored; anything else missing
    # would have been initialised at random.
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    if missing or info.get("unexpected_keys") or info.get("mismatched_keys") or \
            info.get("error_msgs"):
        raise RuntimeError(f"{path}: transformers loaded with differences: {bad}")
    model.eval()
    return model


def hf_token_losses(model, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-token cross-entropy (float32) for inputs x, targets y: (B, T)."""
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(x)).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1),
            reduction="none")
    return loss.reshape(y.shape).numpy().astype(np.float32)


def hf_last_logits(model, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).logits[0, -1].double().numpy()


def ztrain_mean(per_token: np.ndarray) -> np.float32:
    """Transformer::forward: per-token float32 losses summed in double, / N,
    rounded to float."""
    return np.float32(np.sum(per_token.astype(np.float64)) / per_token.size)


def hf_val_loss(model, batches) -> float:
    """trainer.cpp evaluate(): batch means summed in double, / eval_batches,
    rounded to float."""
    s = 0.0
    for x, y in batches:
        s += float(ztrain_mean(hf_token_losses(model, x, y)))
    return float(np.float32(s / len(batches)))


def gpt2_prefix_weights(src: Path, dst: Path, t: int) -> None:
    """A copy of a GPT-2 safetensors file whose wpe keeps the first t rows."""
    from safetensors.numpy import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    key = "transformer.wpe.weight" if "transformer.wpe.weight" in tensors else "wpe.weight"
    tensors[key] = np.ascontiguousarray(tensors[key][:t])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


# --------------------------------------------------------------------------
# the checks


@dataclass
class Row:
    case: str
    check: str
    ztrain: float
    hf: float
    note: str = ""
    ulp: bool = True  # both values are float32 losses: show the difference in ulps

    @property
    def diff(self) -> float:
        return abs(self.ztrain - self.hf)


def check_case(case: Case, zt: Ztrain, work: Path, data: dict, args) -> tuple[list[Row], dict]:
    rows: list[Row] = []
    T = case.model["seq_len"]
    V = case.model["vocab_size"]
    B, EB = args.micro_batch, args.eval_batches
    d = work / case.name
    out = d / "train"
    lr = args.lr

    # 1. train, evaluate at the last step, export
    z_loss = zt.run(case.model, data["train"], data["val"], out, steps=args.steps, lr=lr,
                    min_lr=lr / 10, micro_batch=B, eval_batches=EB)
    model = load_hf(out)
    batches = val_windows(data["val_tokens"], T, B, EB)
    rows.append(Row(case.name, f"train {args.steps} steps: val loss", z_loss,
                    hf_val_loss(model, batches)))

    # how far the weights moved from the initialisation (sanity: lr took effect)
    init_out = d / "init"
    z_init = zt.run(case.model, data["train"], data["val"], init_out, steps=1, lr=0.0,
                    min_lr=0.0, micro_batch=B, eval_batches=EB)
    moved = rel_weight_change(init_out, out)

    # sensitivity of the loss to the non-default settings
    for over in case.sensitivity:
        m2 = load_hf(out, over)
        alt = hf_val_loss(m2, batches)
        rows.append(Row(case.name, "  HF with " + ",".join(f"{k}={v}" for k, v in over.items()),
                        z_loss, alt, "sensitivity: must differ"))
        del m2

    # 2. save with transformers, import into ztrain (lr 0, one step)
    hf_dir = d / "hf_saved"
    model.save_pretrained(hf_dir)
    files = sorted(p.name for p in hf_dir.iterdir())
    sets = [f"model.init_from={hf_dir}", "train.steps=1", "train.lr=0", "train.min_lr=0"]
    z_imp = zt.run(case.model, data["train"], data["val"], d / "import", steps=1, lr=0.0,
                   min_lr=0.0, micro_batch=B, eval_batches=EB, sets=sets)
    rows.append(Row(case.name, "import HF save_pretrained: val loss", z_imp,
                    rows[0].hf, "bit-identical to training run" if z_imp == z_loss else
                    f"training run gave {z_loss!r}"))

    # 3. other val files, each one random micro-batch
    for i, (path, toks) in enumerate(data["extra_vals"]):
        z = zt.run(case.model, data["train"], path, d / f"extra{i}", steps=1, lr=0.0,
                   min_lr=0.0, micro_batch=B, eval_batches=1, sets=sets)
        h = hf_val_loss(model, val_windows(toks, T, B, 1))
        rows.append(Row(case.name, f"import, val file {i + 1} (1 batch)", z, h))

    # 4. per-position losses through prefixes of one sequence
    seq = data["single"]  # T+1 tokens
    seq_path = data["single_path"]
    hf_tok = hf_token_losses(model, seq[None, :T].astype(np.int64),
                             seq[None, 1:T + 1].astype(np.int64))[0]
    z_prefix, h_prefix = [], []
    for t in range(1, T + 1):
        m = dict(case.model, seq_len=t)
        if case.model["arch"] == "gpt2":
            wdir = d / "prefix_weights"
            gpt2_prefix_weights(hf_dir, wdir, t)
        else:
            wdir = hf_dir
        z_prefix.append(zt.run(m, data["train"], seq_path, d / "prefix", steps=1, lr=0.0,
                               min_lr=0.0, micro_batch=1, eval_batches=1,
                               sets=[f"model.init_from={wdir}"] + sets[1:]))
        h_prefix.append(float(ztrain_mean(hf_tok[:t])))
    z_prefix, h_prefix = np.array(z_prefix), np.array(h_prefix)
    t_idx = np.arange(1, T + 1, dtype=np.float64)
    z_tok = t_idx * z_prefix - np.concatenate([[0.0], (t_idx * z_prefix)[:-1]])
    h_tok = hf_tok.astype(np.float64)
    i_pm = int(np.argmax(np.abs(z_prefix - h_prefix)))
    rows.append(Row(case.name, f"prefix means L_t, worst t={i_pm + 1} of {T}",
                    float(z_prefix[i_pm]), float(h_prefix[i_pm])))
    i_pt = int(np.argmax(np.abs(z_tok - h_tok)))
    # resolution: each L_t is a float32, so t*L_t carries up to t*ulp/2 of rounding
    res = (i_pt + 1) * np.spacing(np.float32(z_prefix[i_pt])) / 2 + \
        i_pt * np.spacing(np.float32(z_prefix[max(i_pt - 1, 0)])) / 2
    rows.append(Row(case.name, f"per-token loss, worst position {i_pt} of {T}",
                    float(z_tok[i_pt]), float(h_tok[i_pt]), f"resolution {res:.1e}", ulp=False))

    # 5. last-position logits: vary the final target
    probes = list(range(V)) if args.logit_probes == "all" else \
        sorted(set(np.random.default_rng(7).choice(V, int(args.logit_probes),
                                                   replace=False).tolist()) | {int(seq[T])})
    hf_logits = hf_last_logits(model, seq[None, :T].astype(np.int64))
    zl = {}
    probe_path = d / "probe.bin"
    for v in probes:
        s2 = seq.copy()
        s2[T] = v
        write_tokens(probe_path, s2)
        zl[v] = zt.run(case.model, data["train"], probe_path, d / "probe", steps=1, lr=0.0,
                       min_lr=0.0, micro_batch=1, eval_batches=1, sets=sets)
    h_probe = {}
    for v in probes:
        y = seq[None, 1:T + 1].astype(np.int64).copy()
        y[0, -1] = v
        h_probe[v] = float(ztrain_mean(hf_token_losses(model, seq[None, :T].astype(np.int64), y)))
    i_p = max(probes, key=lambda v: abs(zl[v] - h_probe[v]))
    rows.append(Row(case.name, f"probe means L(v), {len(probes)} probes, worst v={i_p}",
                    zl[i_p], h_probe[i_p]))
    v0 = probes[0]
    # T*(L(v) - L(v0)) = nll(v) - nll(v0) = logit(v0) - logit(v)
    z_diff = np.array([T * (zl[v] - zl[v0]) for v in probes])
    h_diff = np.array([hf_logits[v0] - hf_logits[v] for v in probes])
    i_l = int(np.argmax(np.abs(z_diff - h_diff)))
    res = T * np.spacing(np.float32(max(zl.values())))
    rows.append(Row(case.name, f"logit(v0)-logit(v), {len(probes)} probes, worst v={probes[i_l]}",
                    float(z_diff[i_l]), float(h_diff[i_l]),
                    f"resolution {res:.1e}; logit spread {np.ptp(hf_logits):.2f}", ulp=False))
    if len(probes) == V:
        TL = T * np.array([zl[v] for v in range(V)], dtype=np.float64)
        S = -np.logaddexp.reduce(-TL)
        z_logp = -(TL - S)
        h_logp = hf_logits - np.logaddexp.reduce(hf_logits)
        i_f = int(np.argmax(np.abs(z_logp - h_logp)))
        rows.append(Row(case.name, f"full log-softmax at last position, worst v={i_f}",
                        float(z_logp[i_f]), float(h_logp[i_f]), f"resolution {res:.1e}",
                        ulp=False))

    case_info = dict(files=files, moved=moved, init_loss=z_init)
    print(f"  {case.name}: weights moved {moved:.3f} (relative L2 from init), val loss at init "
          f"{z_init:.6f} -> after training {z_loss:.6f}; save_pretrained wrote {files}",
          file=sys.stderr)
    return rows, case_info


def rel_weight_change(a: Path, b: Path) -> float:
    from safetensors.numpy import load_file

    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    num = sum(float(np.sum((ta[k].astype(np.float64) - tb[k]) ** 2)) for k in ta)
    den = sum(float(np.sum(ta[k].astype(np.float64) ** 2)) for k in ta)
    return math.sqrt(num / den)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ztrain", type=Path, default=Path("/tmp/ztrain-snapshot/bin/ztrain"),
                    help="ztrain binary (default: %(default)s)")
    ap.add_argument("--lib", type=Path, default=None,
                    help="directory for LD_LIBRARY_PATH (default: ../lib beside the binary)")
    ap.add_argument("--work", type=Path, default=None,
                    help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work directory")
    ap.add_argument("--cases", default="all",
                    help="comma-separated case names (default: all): " +
                    ", ".join(c.name for c in CASES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--extra-vals", type=int, default=4,
                    help="additional random single-batch val files")
    ap.add_argument("--logit-probes", default="32",
                    help="vocabulary entries probed at the last position, or 'all'")
    ap.add_argument("--threads", type=int, default=1, help="[device] threads for ztrain")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="largest accepted absolute difference (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    binary = args.ztrain.resolve()
    lib = (args.lib or binary.parent.parent / "lib").resolve()
    if not binary.exists():
        ap.error(f"no ztrain binary at {binary}")
    cases = CASES if args.cases == "all" else [c for c in CASES if c.name in
                                               args.cases.split(",")]
    if not cases:
        ap.error("no such case")

    tmp = None
    if args.work:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="hf_crosscheck_")
        work = Path(tmp)
    print(f"ztrain {binary} (LD_LIBRARY_PATH={lib}); torch {torch.__version__}, "
          f"transformers {transformers.__version__}, numpy {np.__version__}; work {work}",
          file=sys.stderr)

    T, V = SHAPE["seq_len"], SHAPE["vocab_size"]
    rng = np.random.default_rng(args.seed)
    data = {}
    data["train"] = work / "train.bin"
    data["val"] = work / "val.bin"
    write_tokens(data["train"], rng.integers(0, V, 20000))
    # a little more than eval_batches*micro_batch windows: the tail is unused
    data["val_tokens"] = rng.integers(0, V, args.eval_batches * args.micro_batch * T + 7)
    write_tokens(data["val"], data["val_tokens"])
    data["extra_vals"] = []
    for i in range(args.extra_vals):
        toks = rng.integers(0, V, args.micro_batch * T + 1)
        p = work / f"val_extra{i}.bin"
        write_tokens(p, toks)
        data["extra_vals"].append((p, toks))
    data["single"] = rng.integers(0, V, T + 1)
    data["single_path"] = work / "single.bin"
    write_tokens(data["single_path"], data["single"])

    zt = Ztrain(binary, lib, work, args.threads, args.verbose)
    rows: list[Row] = []
    failed = False
    t0 = time.time()
    try:
        for case in cases:
            r, _ = check_case(case, zt, work, data, args)
            rows += r
    finally:
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    w = max(len(r.check) for r in rows)
    cw = max(len(r.case) for r in rows)
    loss_worst: dict[str, float] = {}  # rows comparing float32 losses
    derived_worst: dict[str, float] = {}  # per-token losses, logit differences
    for r in rows:
        if r.note.startswith("sensitivity"):
            continue
        d = loss_worst if r.ulp else derived_worst
        d[r.case] = max(d.get(r.case, 0.0), r.diff)
    print(f"\n{'config':<{cw}}  {'check':<{w}}  {'ztrain':>14}  {'HF':>14}  {'|diff|':>9}"
          f"  {'f32 ulps':>8}  note")
    for r in rows:
        flag = ""
        if r.note.startswith("sensitivity"):
            floor = max(4 * loss_worst.get(r.case, 0.0),
                        4 * float(np.spacing(np.float32(r.ztrain))))
            if r.diff <= floor:
                flag = "  <-- NOT DISCRIMINATING at this size"
        elif r.diff > args.tol:
            flag = "  <-- FAIL"
            failed = True
        # losses (not derived quantities) are float32 values on both sides
        ulps = f"{r.diff / float(np.spacing(np.float32(r.hf))):8.1f}" if r.ulp else " " * 8
        print(f"{r.case:<{cw}}  {r.check:<{w}}  {r.ztrain:14.9f}  {r.hf:14.9f}  {r.diff:9.2e}"
              f"  {ulps}  {r.note}{flag}")
    print("\nlargest |ztrain - HF| per config: losses | derived per-token losses and logit "
          "differences (resolution-limited):")
    for c in loss_worst:
        print(f"  {c:<{cw}}  {loss_worst[c]:.2e} | {derived_worst.get(c, 0.0):.2e}")
    print(f"\n{zt.runs} ztrain runs ({zt.seconds:.0f} s), total {time.time() - t0:.0f} s; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"tolerance {args.tol:g}: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
