#!/usr/bin/env bash
# ztrain compare: one run under several strategies, side by side.
# - Every built-in strategy at world 2 on a small gpt2-tiny: each job
#   completes, the table has a row per strategy, the CSV and JSON hold the
#   same jobs with their per-step curves and peaks (offloaded bytes on the
#   host and NVMe tiers), the HTML page is self-contained (inline SVG, no
#   script, nothing fetched) and draws a loss curve per strategy, and the
#   verdict is "equivalent".
# - One strategy made to differ (its learning rate scaled at step 3 by a
#   test hook): the verdict fails, naming that strategy and step 4, and
#   compare exits 1; the others are not named.
# - A device memory limit between zero3_offload's measured peak and ddp's:
#   ddp is reported out of memory, zero3_offload completes, exit 0.
# - A strategy that does not exist is refused, naming it, before any job
#   runs (exit 2); so is --steps 0. An earlier comparison is not
#   overwritten without --overwrite; a strategy given twice is refused.
# - The HTML page, parsed (tests/e2e/report_page.py): a table row of 14
#   cells per job with a best-value mark, the banner green / red / amber,
#   the difference charts' points equal to the relative differences
#   computed from the jobs' metrics.jsonl, and, out of memory, the
#   [device] memory_limit line and a bar of what the job held and asked.
# - A --set of a [strategy] key goes to the jobs whose strategy has it
#   (nvme_path to zero3_nvme, not zero3), said in a note; one no strategy
#   has is refused.
# - Where Chromium is installed, a headless screenshot of the page shows
#   the charts drawn (pixels of the strategies' colours).
#
# usage: test_compare.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

disk_dir swap
common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set device.threads=1 --set train.warmup_steps=2)
# The NVMe preset with its swap files on this disk.
sed "s|^nvme_path = .*|nvme_path = \"$swap\"|" "$SRC/configs/strategies/zero3_nvme.toml" \
  > "$scratch/zero3_nvme.toml"
names=(ddp zero1 zero2 zero3 zero2_offload zero3_offload zero3_nvme)
all="ddp,zero1,zero2,zero3,zero2_offload,zero3_offload,$scratch/zero3_nvme.toml"

# compare NAME [ARGS...]: ztrain compare into $scratch/NAME; $status is its exit status.
compare() {
  local name=$1
  shift
  status=0
  "$ZTRAIN" compare --nproc 2 --out "$scratch/$name" "${common[@]}" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || status=$?
}

echo "== every built-in strategy at world 2"
compare all --strategies "$all" --steps 6
[ "$status" -eq 0 ] || { cat "$scratch/all.out" >&2; fail "compare exited $status"; }
cat "$scratch/all.out"
for n in "${names[@]}"; do
  grep -Eq "^$n +completed +[0-9.]+ " "$scratch/all.out" || fail "no completed row for $n"
done
grep -q "^verdict: equivalent: zero1, zero2, zero3, zero2_offload, zero3_offload, zero3_nvme reproduce ddp's losses within 1e-06 and gradient norms within 2e-06" \
  "$scratch/all.out" || fail "no equivalence verdict"
[ "$(wc -l < "$scratch/all/compare.csv")" -eq 8 ] || fail "compare.csv does not hold 7 rows"
head -n 1 "$scratch/all/compare.csv" | grep -q "^strategy,outcome,step_time_median_s," ||
  fail "compare.csv has no header"
python3 - "$scratch/all/compare.json" "$scratch/all/compare.csv" << 'PY' || fail "compare.json is wrong"
import csv, json, sys
c = json.load(open(sys.argv[1]))
rows = list(csv.DictReader(open(sys.argv[2])))
assert c["verdict"]["equivalent"] is True and c["verdict"]["reference"] == "ddp", c["verdict"]
assert c["ranks"] == 2 and c["steps"] == 6 and c["precision"] == "fp32"
jobs = {j["strategy"]: j for j in c["strategies"]}
assert list(jobs) == [r["strategy"] for r in rows], "CSV and JSON list different jobs"
ref = jobs["ddp"]["steps"]
for name, j in jobs.items():
    assert j["outcome"] == "completed", name
    assert [s["step"] for s in j["steps"]] == list(range(1, 7)), name
    for a, b in zip(j["steps"], ref):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]), (name, a, b)
    assert j["final_val_loss"] is not None, name
    assert j["bytes_per_step"] > 0, name  # world 2: every strategy communicates
    assert j["peak_bytes"]["device"]["total"] > 0, name
    row = next(r for r in rows if r["strategy"] == name)
    assert float(row["final_train_loss"]) == j["final_train_loss"], name
    assert int(row["peak_device_total"]) == j["peak_bytes"]["device"]["total"], name
for name in ("zero2_offload", "zero3_offload", "zero3_nvme"):
    assert jobs[name]["peak_bytes"]["host"]["total"] > 0, name
assert jobs["zero3_nvme"]["peak_bytes"]["nvme"]["optimizer"] > 0
assert jobs["ddp"]["peak_bytes"]["host"]["total"] == 0
print("compare.json and compare.csv: 7 jobs, 6 steps each, equal losses, peaks per tier")
PY
html="$scratch/all/compare.html"
grep -q '<rect class="bar"' "$html" || fail "no bars drawn"
# url(#...) is the hatch pattern defined on the page itself.
grep -Eq "<script|src=|href=|@import|url\([^#]" "$html" && fail "the report loads something"
# page_checks PAGE NAME CHECKS: runs the Python CHECKS against the parsed
# page, with the comparison's directory as argv[0].
page_checks() {
  python3 "$SRC/tests/e2e/report_page.py" "$1" - "$(dirname "$1")" <<< "$3" > "$scratch/$2_page.out" 2>&1 ||
    { cat "$scratch/$2_page.out" >&2; fail "$2: the page is wrong"; }
  cat "$scratch/$2_page.out"
}
# The difference charts against the jobs' own metrics: each strategy's
# relative loss and gradient-norm difference from ddp at every step.
diff_checks='
import json, os
def steps(name):
    lines = [json.loads(l) for l in open(os.path.join(argv[0], name, "metrics.jsonl"))]
    return [l for l in lines if l["split"] == "train"]
ref = steps("ddp")
for chart, key in (("diff_loss", "loss"), ("diff_grad_norm", "grad_norm")):
    c = page.charts[chart]
    floor = 10 ** float(c["attrs"]["data-y-range"].split()[0])
    assert set(c["curves"]) == set(names) - {"ddp"}, (chart, sorted(c["curves"]))
    for name in c["curves"]:
        drawn = page.values(chart, name)
        want = [abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(steps(name), ref)]
        assert len(drawn) == len(want), (chart, name, drawn)
        for (x, y), (i, w) in zip(drawn, enumerate(want)):
            assert abs(x - (i + 1)) < 0.05, (chart, name, x, i)
            assert w <= floor * 1.02 if w == 0 else abs(math.log10(y) - math.log10(max(w, floor))) < 0.01, (chart, name, i, y, w)
print("difference charts: every point is the relative difference in metrics.jsonl")
'
page_checks "$html" all "names = $(printf '%s\n' "${names[@]}" | python3 -c 'import sys; print([l.strip() for l in sys.stdin])')
assert page.verdict_class == \"verdict green\", page.verdict_class
t = page.tables[\"jobs\"]
assert len(t[\"header\"]) == 14 and t[\"header\"][2] == \"step, median (s)\", t[\"header\"]
assert [r[0][0] for r in t[\"rows\"]] == names and all(len(r) == 14 for r in t[\"rows\"]), t[\"rows\"]
assert any(\"best\" in cls for r in t[\"rows\"] for _, cls in r), \"no best value marked\"
assert not t[\"errors\"], t[\"errors\"]
assert len(page.charts[\"loss\"][\"curves\"]) == 7, \"not one loss curve per strategy\"
for chart in (\"val_loss\", \"grad_norm\", \"lr\", \"step_time\", \"throughput\", \"memory_device\", \"comm_bytes\"):
    assert chart in page.charts, chart
print(\"table: 7 rows of 14 cells, a best mark; banner green\")
$diff_checks"
[ -z "$(ls -A "$swap")" ] || fail "swap files left in $swap"

echo "== one strategy made to differ"
ZTRAIN_TEST_COMPARE_PERTURB=zero2:3 compare differ --strategies ddp,zero1,zero2 --steps 6
[ "$status" -eq 1 ] || { cat "$scratch/differ.out" >&2; fail "a failed verdict exited $status, not 1"; }
grep -q "^verdict: FAILED: zero2 differs from ddp first at step 4: loss " "$scratch/differ.out" ||
  { cat "$scratch/differ.out" >&2; fail "the failure does not name zero2 and step 4"; }
grep "^verdict" "$scratch/differ.out" | grep -q zero1 && fail "zero1 is named as differing"
page_checks "$scratch/differ/compare.html" differ "names = [\"ddp\", \"zero1\", \"zero2\"]
assert page.verdict_class == \"verdict red\" and \"first at step 4\" in page.verdict_text, page.verdict_text
$diff_checks"
python3 -c "import json,sys; v=json.load(open(sys.argv[1]))['verdict']; assert not v['equivalent']" \
  "$scratch/differ/compare.json" || fail "compare.json says equivalent"
echo "the differing strategy and its first step are named"

echo "== a strategy out of memory"
limit=$(python3 - "$scratch/all/compare.json" << 'PY'
import json, sys
jobs = {j["strategy"]: j for j in json.load(open(sys.argv[1]))["strategies"]}
low = jobs["zero3_offload"]["peak_bytes"]["device"]["total"]
high = jobs["ddp"]["peak_bytes"]["device"]["total"]
assert low < high, (low, high)
print((low + high) // 2)
PY
)
# Two strategies complete and agree, so only ddp's running out of memory
# keeps the banner from green.
compare oom --strategies "ddp,zero3_offload,$scratch/zero3_nvme.toml" --steps 3 \
  --set device.memory_limit="$limit"
[ "$status" -eq 0 ] || { cat "$scratch/oom.out" >&2; fail "an out-of-memory job made compare exit $status"; }
grep -Eq "^ddp +out of memory +out of memory on tier 'device'" "$scratch/oom.out" ||
  { cat "$scratch/oom.out" >&2; fail "ddp is not reported out of memory"; }
grep -Eq "^zero3_offload +completed" "$scratch/oom.out" && grep -Eq "^zero3_nvme +completed" \
  "$scratch/oom.out" || fail "zero3_offload and zero3_nvme did not both complete"
grep -q "^verdict: equivalent: zero3_nvme reproduces zero3_offload's" "$scratch/oom.out" ||
  fail "the two completed strategies were not found equivalent"
page_checks "$scratch/oom/compare.html" oom "limit = $limit
assert page.verdict_class == \"verdict amber\", page.verdict_class
t = page.tables[\"jobs\"]
assert len(t[\"rows\"]) == 3 and all(len(r) == 14 for r in t[\"rows\"]), t[\"rows\"]
(error, span), = t[\"errors\"]
assert error.startswith(\"ddp: out of memory on tier\") and span == \"14\", t[\"errors\"]
m = page.charts[\"memory_device\"]
assert any(\"budget\" in l.get(\"class\", \"\") for l in m[\"lines\"]), \"no memory_limit line\"
assert any(t.startswith(\"[device] memory_limit\") for t in m[\"texts\"]), m[\"texts\"]
assert any(\"asked\" in r.get(\"class\", \"\") for r in m[\"rects\"]), \"no bar of what ddp asked for\"
print(\"out of memory: banner amber, the error in a full-width row, the limit line and the asked bar\")"
echo "ddp out of memory under a $limit-byte limit; zero3_offload and zero3_nvme completed, equivalent"

echo "== failures and refusals"
compare missing --strategies ddp,nosuch,zero1 --steps 2
[ "$status" -eq 2 ] || fail "an unknown strategy made compare exit $status, not 2"
grep -q "not every strategy can run, so none was started" "$scratch/missing.out" &&
  grep -q "^  nosuch: no strategy plugin named 'nosuch'" "$scratch/missing.out" ||
  { cat "$scratch/missing.out" >&2; fail "the unknown strategy is not named before any job"; }
! grep -q "^ddp" "$scratch/missing.out" && [ ! -e "$scratch/missing" ] || fail "a job ran before the check"
compare zero_steps --strategies ddp,zero1 --steps 0
[ "$status" -eq 2 ] && grep -q "compare: --steps 0: give 1 or more" "$scratch/zero_steps.out" ||
  fail "--steps 0 was not refused"
compare all --strategies ddp --steps 2
[ "$status" -eq 2 ] && grep -q "holds an earlier comparison; give another --out or --overwrite" \
  "$scratch/all.out" || fail "an earlier comparison was not protected"
compare twice --strategies ddp,zero1,ddp
[ "$status" -eq 2 ] && grep -q "strategy 'ddp' is given twice" "$scratch/twice.out" ||
  fail "a strategy given twice was not refused"
compare set_nowhere --strategies ddp,zero1 --steps 2 --set strategy.offload_optimizer.nvme_path=x
[ "$status" -eq 2 ] && grep -q "no strategy of --strategies has the key offload_optimizer.nvme_path" \
  "$scratch/set_nowhere.out" || fail "a [strategy] key no strategy has was not refused"
echo "an unknown strategy, --steps 0, an earlier comparison, a repeated strategy and a [strategy] key no strategy has are refused"

echo "== a [strategy] key goes to the strategies that have it"
compare nvme_set --strategies zero3,zero3_nvme --steps 2 --set "strategy.offload_optimizer.nvme_path=$swap"
[ "$status" -eq 0 ] || fail "compare with zero3_nvme's nvme_path exited $status"
grep -q "^note: --set strategy.offload_optimizer.nvme_path=$swap goes to zero3_nvme alone" \
  "$scratch/nvme_set.out" || fail "the note on the override is missing"
grep -Eq "^zero3_nvme +completed" "$scratch/nvme_set.out" && grep -Eq "^zero3 +completed" \
  "$scratch/nvme_set.out" || fail "zero3 and zero3_nvme did not both train"
! grep -q "size unknown" "$scratch/nvme_set/compare.html" ||
  fail "the page's model line lost the model's size to the job-only override"
echo "nvme_path went to zero3_nvme alone; both trained"

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "skipped: the screenshot (no chromium installed)"
  exit 0
fi
echo "== the report in headless Chromium"
"$browser" --headless --no-sandbox --disable-gpu --window-size=1100,4200 \
  --screenshot="$scratch/report.png" "file://$html" > "$scratch/chromium.out" 2>&1 ||
  { cat "$scratch/chromium.out" >&2; fail "chromium failed"; }
python3 - "$scratch/report.png" << 'PY' || fail "the screenshot shows no charts"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, width, height, ctype = 8, b"", 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), (depth, ctype)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = width * bpp
rows, prev, i = [], bytearray(stride), 0
for _ in range(height):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
colours = {(0x1f, 0x77, 0xb4): 0, (0xd6, 0x27, 0x28): 0, (0x4e, 0x79, 0xa7): 0}
for line in rows:
    for x in range(0, stride, bpp):
        px = tuple(line[x:x + 3])
        if px in colours:
            colours[px] += 1
print("pixels of the first curve, second curve and params bars:", list(colours.values()))
assert all(v > 50 for v in colours.values()), colours
PY
echo "the charts render in Chromium"
