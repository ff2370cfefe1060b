#!/usr/bin/env bash
# A ~30-step tiny run of the real binary on the shipped run file: it exits 0,
# writes metrics.jsonl with one valid JSON object per line carrying the
# documented keys, evaluates at least once, learns (the last train loss is
# clearly below the first) and prints the summary.
#
# usage: test_short_run.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail

source "$(dirname "$0")/lib.sh"

# A line-by-line JSON validator (no python in CI): every line must be one
# JSON object and nothing else.
json_lines_valid() {
  awk '
    function bad(msg) { err = msg " at column " pos; return 0 }
    function ws() { while (pos <= n && index(" \t\r", substr(s, pos, 1)) > 0) pos++ }
    function value(   c) {
      ws()
      if (pos > n) return bad("unexpected end of line")
      c = substr(s, pos, 1)
      if (c == "{") return object()
      if (c == "[") return array()
      if (c == "\"") return string()
      if (substr(s, pos, 4) == "true" || substr(s, pos, 4) == "null") { pos += 4; return 1 }
      if (substr(s, pos, 5) == "false") { pos += 5; return 1 }
      if (match(substr(s, pos), /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/)) {
        pos += RLENGTH
        return 1
      }
      return bad("not a JSON value")
    }
    function string(   c) {
      pos++
      while (pos <= n) {
        c = substr(s, pos, 1)
        if (c == "\"") { pos++; return 1 }
        if (c == "\\") {
          c = substr(s, pos + 1, 1)
          if (c == "u") {
            if (substr(s, pos + 2, 4) !~ /^[0-9a-fA-F][0-9a-fA-F][0-9a-fA-F][0-9a-fA-F]$/)
              return bad("bad \\u escape")
            pos += 6
            continue
          }
          if (c == "" || index("\"\\/bfnrt", c) == 0) return bad("bad escape")
          pos += 2
          continue
        }
        if (c == "\t") return bad("raw tab in a string")
        pos++
      }
      return bad("unterminated string")
    }
    function array(   c) {
      pos++
      ws()
      if (substr(s, pos, 1) == "]") { pos++; return 1 }
      while (1) {
        if (!value()) return 0
        ws()
        c = substr(s, pos, 1)
        if (c == ",") { pos++; continue }
        if (c == "]") { pos++; return 1 }
        return bad("expected , or ]")
      }
    }
    function object(   c) {
      pos++
      ws()
      if (substr(s, pos, 1) == "}") { pos++; return 1 }
      while (1) {
        ws()
        if (substr(s, pos, 1) != "\"") return bad("expected a quoted key")
        if (!string()) return 0
        ws()
        if (substr(s, pos, 1) != ":") return bad("expected :")
        pos++
        if (!value()) return 0
        ws()
        c = substr(s, pos, 1)
        if (c == ",") { pos++; continue }
        if (c == "}") { pos++; return 1 }
        return bad("expected , or }")
      }
    }
    {
      s = $0; n = length(s); pos = 1; err = ""
      ok = substr(s, 1, 1) == "{" ? value() : bad("not an object")
      if (ok) { ws(); if (pos <= n) ok = bad("trailing text") }
      if (!ok) { printf "line %d is not valid JSON (%s): %s\n", NR, err, s > "/dev/stderr"; invalid = 1 }
    }
    END { exit invalid }
  ' "$1"
}

# The validator must reject what it is meant to reject, or the check below
# proves nothing.
printf '%s\n' '{"a": 1, "b": [1, 2.5e-3, true, null], "c": {"d": "x\"y"}}' >"$scratch/good.json"
json_lines_valid "$scratch/good.json" || fail "the JSON checker rejects valid JSON"
for invalid in '{"a": 1,}' '{"a": nan}' '{"a": 1} x' '{"a" 1}' '{"a": "b}' '{a: 1}' '{"a": 01}' '[1]'; do
  printf '%s\n' "$invalid" >"$scratch/bad.json"
  if json_lines_valid "$scratch/bad.json" 2>/dev/null; then
    fail "the JSON checker accepts invalid JSON: $invalid"
  fi
done

out="$scratch/run"
rc=0
"$ZTRAIN" \
  --set train.steps=30 \
  --set train.warmup_steps=10 \
  --set train.log_every=5 \
  --set train.eval_every=15 \
  --set train.micro_batch_size=8 \
  --set model.n_layer=2 \
  --set model.n_head=2 \
  --set model.n_embd=64 \
  --set model.seq_len=32 \
  --set model.vocab_size=64 \
  --set train.out_dir="\"$out\"" \
  "$SRC/configs/run.toml" >"$scratch/stdout" 2>"$scratch/stderr" || rc=$?
if [[ $rc -ne 0 ]]; then
  cat "$scratch/stdout" "$scratch/stderr" >&2
  fail "the run exited with status $rc"
fi

metrics="$out/metrics.jsonl"
[[ -s "$metrics" ]] || fail "$metrics is missing or empty"
[[ -s "$out/config.toml" ]] || fail "$out/config.toml (the merged config) is missing"
json_lines_valid "$metrics" || fail "$metrics has lines that are not valid JSON"

# Every line names its step, split and loss.
while IFS= read -r line; do
  for key in step split loss; do
    [[ "$line" == *"\"$key\": "* ]] || fail "metrics line without \"$key\": $line"
  done
done <"$metrics"

grep '"split": "train"' "$metrics" >"$scratch/train.jsonl" ||
  fail "no line of $metrics has \"split\": \"train\"; first line: $(head -n 1 "$metrics")"
grep -q '"split": "val"' "$metrics" ||
  fail "no line of $metrics has \"split\": \"val\" (evaluation every 15 steps)"
n_train=$(wc -l <"$scratch/train.jsonl")
n_val=$(grep -c '"split": "val"' "$metrics")
# log_every 5 over 30 steps: steps 1, 5, 10, ..., 30; evaluation at 15 and 30.
[[ $n_train -eq 7 ]] || fail "expected 7 train lines (steps 1, 5, ..., 30), found $n_train"
[[ $n_val -eq 2 ]] || fail "expected 2 val lines (steps 15 and 30), found $n_val"
[[ $((n_train + n_val)) -eq $(wc -l <"$metrics") ]] ||
  fail "$metrics has lines that are neither train nor val"

while IFS= read -r line; do
  for key in step loss lr grad_norm tokens_per_s peak_bytes; do
    [[ "$line" == *"\"$key\": "* ]] || fail "train metrics line without \"$key\": $line"
  done
done <"$scratch/train.jsonl"

# Every line, train and val alike, ends with when it was written: UTC in
# RFC 3339 with milliseconds, and seconds since the run opened the file.
python3 - "$metrics" << 'PY' || fail "$metrics: a line without its time stamps"
import datetime, json, sys
last = -1.0
for n, line in enumerate(open(sys.argv[1]), 1):
    r = json.loads(line)
    t, e = r["time"], r["elapsed_s"]
    assert len(t) == 24 and t.endswith("Z") and t[19] == ".", (n, t)
    when = datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
    age = (datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()
    assert 0 <= age < 600, (n, t, age)
    assert e >= last, (n, e, last)
    last = e
    assert list(r)[-2:] == ["time", "elapsed_s"], (n, list(r))
PY

field() { # field KEY FILE: the numeric value of "KEY" on each line
  sed -n "s/.*\"$1\": \\([-0-9.eE+]*\\).*/\\1/p" "$2"
}
steps=$(field step "$scratch/train.jsonl" | tr '\n' ' ')
[[ "$steps" == "1 5 10 15 20 25 30 " ]] || fail "train lines are for steps '$steps', expected 1 5 10 ... 30"
field loss "$scratch/train.jsonl" >"$scratch/losses"
[[ $(wc -l <"$scratch/losses") -eq $n_train ]] || fail "a train line has no numeric loss"
first=$(head -n 1 "$scratch/losses")
last=$(tail -n 1 "$scratch/losses")
# At step 1 the loss is about ln(64) = 4.16; the source's entropy is 1.24.
awk -v f="$first" 'BEGIN { exit !(f > 3.5 && f < 5.0) }' ||
  fail "first train loss $first is not near ln(vocab_size) = 4.16"
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 1.0) }' ||
  fail "the model did not learn: first train loss $first, last $last (expected a drop of more than 1.0)"
field grad_norm "$scratch/train.jsonl" | awk '!($1 > 0) { exit 1 }' || fail "a grad_norm is not positive"
field tokens_per_s "$scratch/train.jsonl" | awk '!($1 > 0) { exit 1 }' || fail "a tokens_per_s is not positive"
grep -q '"peak_bytes": {"device": {' "$scratch/train.jsonl" || fail "peak_bytes is not an object per tier"
grep '"split": "val"' "$metrics" | field loss /dev/stdin | awk '!($1 > 0 && $1 < 5) { exit 1 }' ||
  fail "a val loss is missing or implausible"

grep -q '^done: 30 steps' "$scratch/stdout" || {
  cat "$scratch/stdout" >&2
  fail "stdout has no summary line 'done: 30 steps ...'"
}
grep -q 'final train loss' "$scratch/stdout" || fail "the summary has no final train loss"
grep -qF "metrics: $metrics" "$scratch/stdout" || fail "the summary does not name the metrics file"

echo "test_short_run: ok (loss $first -> $last)"
