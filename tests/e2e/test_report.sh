#!/usr/bin/env bash
# ztrain report: the compare page for runs already trained.
# - Two short runs (another learning rate in the second) into their own
#   out_dirs; `ztrain report A B --out page.html` writes one page: a table
#   row of 12 cells per run, the banner neutral (no equivalence verdict),
#   one training-loss curve per run whose last point is the run's last
#   logged loss, the learning-rate chart, each run's resolved config shown.
# - One run alone: the page lands in RUN_DIR/report.html.
# - A directory without metrics.jsonl is refused, naming the file and what
#   to give instead (exit 1); no run directory at all is a usage error.
# - A metrics file whose last line was cut short (a full disk, a kill) is
#   read without that line, with a note; a damaged line elsewhere is an
#   error naming file:line.
#
# usage: test_report.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set device.threads=1 --set train.warmup_steps=2
  --set train.steps=5 --set train.log_every=1 --set train.eval_every=5
  --set train.save_final=false --set train.checkpoint_every=0)
for run in a b; do
  lr=$([ "$run" = a ] && echo 3e-3 || echo 1e-3)
  "$ZTRAIN" "${common[@]}" --set train.lr=$lr --set train.out_dir="$scratch/$run" \
    "$SRC/configs/run.toml" > "$scratch/train_$run.out" 2>&1 || fail "run $run did not train"
done

echo "== two runs on one page"
"$ZTRAIN" report "$scratch/a" "$scratch/b" --out "$scratch/page.html" > "$scratch/report.out" 2>&1 ||
  fail "ztrain report failed"
grep -q "^written: $scratch/page.html" "$scratch/report.out" || fail "the page's path is not said"
python3 "$SRC/tests/e2e/report_page.py" "$scratch/page.html" - "$scratch" << 'PY' > "$scratch/page.out" 2>&1 ||
import json, os
assert page.verdict_class == "verdict neutral", page.verdict_class
assert "no equivalence verdict" in page.verdict_text, page.verdict_text
t = page.tables["runs"]
assert len(t["header"]) == 12, t["header"]
assert [r[0][0] for r in t["rows"]] == ["a", "b"] and all(len(r) == 12 for r in t["rows"]), t["rows"]
assert any("best" in cls for r in t["rows"] for _, cls in r), "no best value marked"
for run in ("a", "b"):
    train = [json.loads(l) for l in open(os.path.join(argv[0], run, "metrics.jsonl"))]
    train = [l for l in train if l["split"] == "train"]
    x, y = page.values("loss", run)[-1]
    assert abs(x - 5) < 0.05 and abs(y - train[-1]["loss"]) < 1e-3, (run, x, y, train[-1])
    x, y = page.values("lr", run)[-1]
    assert abs(y - train[-1]["lr"]) < 1e-5, (run, y, train[-1]["lr"])
for chart in ("val_loss", "grad_norm", "throughput", "memory_over_steps", "memory_device"):
    assert chart in page.charts, chart
print("two runs: 2 rows of 12 cells, neutral banner, the last losses and learning rates drawn")
PY
  { cat "$scratch/page.out" >&2; fail "the page is wrong"; }
cat "$scratch/page.out"
grep -q "lr = 0.001  # --set train.lr=1e-3" "$scratch/page.html" || fail "b's resolved config is not shown"

echo "== one run"
"$ZTRAIN" report "$scratch/a" > "$scratch/one.out" 2>&1 || fail "ztrain report of one run failed"
[ -s "$scratch/a/report.html" ] || fail "no $scratch/a/report.html"

echo "== refusals"
mkdir -p "$scratch/empty"
status=0
"$ZTRAIN" report "$scratch/empty" > "$scratch/empty.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -q "metrics.jsonl' does not exist" "$scratch/empty.out" ||
  fail "a directory without metrics.jsonl was not refused (exit $status)"
status=0
"$ZTRAIN" report > "$scratch/none.out" 2>&1 || status=$?
[ "$status" -eq 2 ] && grep -q "usage: ztrain report RUN_DIR" "$scratch/none.out" ||
  fail "no run directory was not refused (exit $status)"
echo "a directory without metrics.jsonl and no directory at all are refused"

# A metrics file whose last line a full disk or a kill cut short: the line
# is left out, with a note; a damaged line elsewhere names file and line.
cp -r "$scratch/a" "$scratch/torn"
printf '{"step": 99, "split": "tra' >> "$scratch/torn/metrics.jsonl"
"$ZTRAIN" report "$scratch/torn" > "$scratch/torn.out" 2>&1 || fail "report of a cut-short metrics file failed: $(cat "$scratch/torn.out")"
grep -qF "report: $scratch/torn/metrics.jsonl: its last line is cut short" "$scratch/torn.out" ||
  fail "the cut-short line is not said: $(cat "$scratch/torn.out")"
cp -r "$scratch/a" "$scratch/damaged"
sed -i '2s/.*/{"step": 2, "split"/' "$scratch/damaged/metrics.jsonl"
status=0
"$ZTRAIN" report "$scratch/damaged" > "$scratch/damaged.out" 2>&1 || status=$?
[ "$status" -eq 1 ] && grep -qF "$scratch/damaged/metrics.jsonl:2: not a metrics record" "$scratch/damaged.out" ||
  fail "a damaged line is not named (exit $status): $(cat "$scratch/damaged.out")"
echo "a cut-short last line is left out with a note; a damaged line is named"
