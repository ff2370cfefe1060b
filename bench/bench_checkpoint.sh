#!/usr/bin/env bash
# Checkpoints of gpt2-124m (fp32, 1 x 64 tokens per rank and step; 12
# bytes of state per parameter: fp32 weights, m and v), in one script,
# at world 1 (ddp, 1 rank x 2 threads) and world 2 (zero1, 2 ranks x 1
# thread, each rank writing and reading its own file in parallel):
#  - write: bytes / seconds of the metrics' checkpoint lines (median over a
#    run with train.checkpoint_every = 1 written within the step,
#    train.checkpoint_write = "in_step": STEPS checkpoints) against a
#    plain sequential write of the same bytes to the same file system in
#    the same pattern: WORLD parallel writers of bytes / WORLD each, from
#    a buffer of that size in memory (4 MiB write()s, fsync), STEPS files
#    in turn, each followed by removing the one two before it (ztrain keeps
#    train.keep_last = 2) and a pause of one step time; the ratio of the
#    medians and of the best (fastest) files, goal ztrain >= 70 % of plain;
#  - read: rank 0's bytes / seconds of reading and checking the state (the
#    "resuming ..." line of a run resumed from the last checkpoint, which
#    also gives the whole resume's seconds), against a plain sequential read of
#    the same checkpoint files into buffers of their size (one reader per
#    rank, rank 0's time; median of ROUNDS), goal >= 70 %;
#  - the cost of a checkpoint to training: runs of 3.5 EVERY steps with a
#    checkpoint every EVERY steps and at the end (often enough to measure,
#    rarely enough that a background write ends before the next
#    checkpoint), written within the step and written in the background,
#    measured within each run (below, cost_of): the seconds
#    the training thread was held plus the slowdown of the steps after the
#    checkpoint against the run's steady steps, and as the time a
#    checkpoint every 100 steps adds. At world 1
#    with 2 threads and world 2 with 1 thread per rank every core computes,
#    so a background write takes cores from training; world 1 with 1
#    thread leaves a core free, as a GPU host's CPU mostly is.
# On virtual machines that hand freed memory back to the host (virtio-
# balloon free page reporting, as on this project's Firecracker machines),
# page cache made of memory freed more than a second or two before is
# slow to fill (a host fault per page: about 0.4-0.5 GB/s there, against
# 1.4-2 GB/s for memory freed just before): successive checkpoints differ
# there by up to 4x, hence the ranges, and a median of such a mix can
# fall on either side, the ratio of the best files is the steadier one;
# on bare metal they agree. Reads are measured cold (after `sync; echo 3 >
# /proc/sys/vm/drop_caches`, which needs root and drops the whole
# machine's page cache; a virtual machine's host may still cache the disk)
# and warm (right after); where the caches cannot be dropped only warm
# reads are reported, for both. The plain reader drops the caches itself,
# 0.3 s before reading: the better case.
# Each read is measured ROUNDS times (cold ones after dropping the caches
# each time), ztrain's and the plain reader's, and the medians compared:
# one cold resume of this VM's disk took anywhere from 0.8 to 1.9 s.
# SCRATCH_DIR must be on the disk to measure (not tmpfs); the script works
# in a fresh directory under it and removes it at the end. Needs python3
# (standard library only).
#
#   bench/bench_checkpoint.sh [BUILD_DIR] [SCRATCH_DIR] [STEPS] [ROUNDS] [EVERY]
# (defaults 8 steps, 3 rounds, a checkpoint every 20 steps)
set -euo pipefail
build=${1:-build}
src=$(cd "$(dirname "$0")/.." && pwd)
scratch=${2:-$(dirname "$src")/ckbench}
steps=${3:-8}
rounds=${4:-3}
every=${5:-20}
[ "$steps" -ge 3 ] || { echo "STEPS must be 3 or more: step times are medians of steps 3.."; exit 1; }
[ "$every" -ge 2 ] || { echo "EVERY must be 2 or more"; exit 1; }
ztrain=$(realpath "$build/bin/ztrain")
mkdir -p "$scratch"
out=$(mktemp -d "$(realpath "$scratch")/ckbench.XXXXXX")
trap 'rm -rf "$out"' EXIT
fstype=$(df --output=fstype "$out" | tail -n 1)
case $fstype in
  tmpfs | ramfs) echo "warning: $scratch is on $fstype, not a disk: the figures are of memory" ;;
esac
common=(--model gpt2-124m --set model.seq_len=64 --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false --set train.grad_accum=1 --set train.micro_batch_size=1)
declare -A strategy=([1]=ddp [2]=zero1)
cold=false
if (sync && echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null; then cold=true; fi
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

ours() {  # ours LOG RUN_DIR WORLD EVERY STEPS [ARGS...]
  local log=$1 dir=$2 world=$3 every=$4 n=$5
  shift 5
  "$ztrain" --nproc "$world" "${common[@]}" --strategy "${strategy[$world]}" \
    --set device.threads=$((2 / world)) --set train.steps="$n" --set train.checkpoint_every="$every" \
    --set train.out_dir="$out/$dir" "$@" "$src/configs/run.toml" > "$out/$log.log" 2>&1 ||
    { cat "$out/$log.log"; exit 1; }
}
source "$src/bench/metrics.sh"
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
range() { sort -g | awk 'NR == 1 { a = $1 } { b = $1 } END { printf "%.2f-%.2f", a, b }'; }

# The plain reader and writer: fills a buffer of BYTES (every page touched)
# and waits for START (epoch seconds), then
#   read PATH [drop]: reads PATH into the buffer, with drop after dropping
#     the page cache 0.3 s before START;
#   rotate PATH COUNT GAP: writes PATH.1 .. PATH.COUNT from the buffer
#     (4 MiB write()s, fsync), after each removing the one two before it
#     and sleeping GAP seconds;
# and prints the begin and end times of each read or write, a line each.
cat > "$out/plain_io.py" << 'PY'
import os, sys, time
mode, path, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
chunk = 4 << 20
buf = bytearray(n)
piece = os.urandom(chunk)
for o in range(0, n, chunk):
    buf[o:o + chunk] = piece[:min(chunk, n - o)]
view = memoryview(buf)
if time.time() > start:
    print("plain_io.py: buffer filled %.2f s after the start" % (time.time() - start), file=sys.stderr)


def write(p):
    t = time.time()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    o = 0
    while o < n:
        o += os.write(fd, view[o:o + chunk])
    os.fsync(fd)
    os.close(fd)
    print("%.6f %.6f" % (t, time.time()), flush=True)


if sys.argv[5:] == ["drop"]:
    time.sleep(max(0.0, start - 0.3 - time.time()))
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
time.sleep(max(0.0, start - time.time()))
if mode == "rotate":
    for k in range(1, int(sys.argv[5]) + 1):
        write("%s.%d" % (path, k))
        if k > 2:
            os.unlink("%s.%d" % (path, k - 2))
        time.sleep(float(sys.argv[6]))
else:
    t = time.time()
    fd = os.open(path, os.O_RDONLY)
    o = 0
    while o < n:
        r = os.readv(fd, [view[o:o + chunk]])
        if r == 0:
            sys.exit(path + ": shorter than " + str(n))
        o += r
    os.close(fd)
    print("%.6f %.6f" % (t, time.time()))
PY
# plain MODE BYTES PATH[:ARG...]...: one plain_io.py MODE PATH BYTES START
# ARG... per PATH, all at once, 3 s from now (their buffers filled); prints
# for each of their reads or writes the seconds from the first begin to
# the last end over them, and the first one's own seconds.
plain() {
  local mode=$1 n=$2 start f i=0 pids=() a
  start=$(awk -v t="$(date +%s.%N)" 'BEGIN { printf "%.3f", t + 3 }')
  shift 2
  for f in "$@"; do
    IFS=: read -r -a a <<< "$f"
    python3 "$out/plain_io.py" "$mode" "${a[0]}" "$n" "$start" "${a[@]:1}" > "$out/plain.$i" &
    pids+=($!) i=$((i + 1))
  done
  for f in "${pids[@]}"; do wait "$f"; done
  paste -d ' ' "$out"/plain.[0-9]* | awk '{ b = $1; e = $2
    for (i = 3; i < NF; i += 2) { if ($i < b) b = $i; if ($(i + 1) > e) e = $(i + 1) }
    printf "%.4f %.4f\n", e - b, $2 - $1 }'
  rm -f "$out"/plain.[0-9]*
}
# resume_s LOG: the seconds of the "resuming" line: reading and checking
# the state (its bytes are rank 0's file, rounded); resumed_s LOG: the whole
# resume (with the strategy's placing: zero1 all-gathers the parameters)
resume_s() { sed -n 's/.* of state read by rank 0 in \([0-9.]*\) s;.*/\1/p' "$out/$1.log"; }
resumed_s() { sed -n 's/.*; resumed in \([0-9.]*\) s).*/\1/p' "$out/$1.log"; }
gbs() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.3f", b / s / 1e9 }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
ck_field() {  # ck_field RUN: "bytes seconds held_s overlapped copy_s commit_s" of each checkpoint line
  sed -n 's/.*"split": "checkpoint".*"bytes": \([0-9]*\).*"seconds": \([0-9.e+-]*\).*"held_s": \([0-9.e+-]*\).*"copy_s": \([0-9.e+-]*\).*"commit_s": \([0-9.e+-]*\).*"overlapped": \([a-z]*\).*/\1 \2 \3 \6 \4 \5/p' \
    "$out/$1/metrics.jsonl"
}

rows_w=() rows_r=() rows_c=()
for world in 1 2; do
  base=base.w$world ck=ck.w$world
  ours "$base" "$base" "$world" 0 "$steps"
  ours "$ck" "$ck" "$world" 1 "$steps" --set train.checkpoint_write=in_step
  read -r bytes _ <<< "$(ck_field "$ck" | head -n 1)"
  n_ck=$(ck_field "$ck" | wc -l)
  ck_s=$(ck_field "$ck" | awk '{ print $2 }' | med)
  ck_range=$(ck_field "$ck" | awk '{ print $2 }' | range)
  zb=$(ck_field "$ck" | awk '{ print $2 }' | sort -g | head -n 1)
  last="$out/$ck/step_$steps"
  t0=$(median "$base" step_time_s)  # the plain writer's pause between files

  # Reads: ztrain resuming the last checkpoint (one more step), then the
  # plain reader on the same files.
  modes=(warm)
  if $cold; then modes=(cold warm); fi
  for mode in "${modes[@]}"; do
    for i in $(seq "$rounds"); do
      if [ "$mode" = cold ]; then drop; fi
      ours "resume.$mode.w$world.$i" "$ck" "$world" 0 $((steps + 1)) --resume "$last"
    done
  done
  rank0=$(stat -c %s "$last/rank_0.bin")
  files=()
  for r in $(seq 0 $((world - 1))); do
    [ "$(stat -c %s "$last/rank_$r.bin")" = "$rank0" ] || { echo "rank files of unequal sizes:"; ls -l "$last"; exit 1; }
    files+=("$last/rank_$r.bin")
  done
  for mode in "${modes[@]}"; do
    for _ in $(seq "$rounds"); do
      if [ "$mode" = cold ]; then
        plain read "$rank0" "${files[0]}:drop" "${files[@]:1}"
      else
        plain read "$rank0" "${files[@]}"
      fi
    done | awk '{ print $2 }' > "$out/plain_read.$mode.w$world"
  done
  for mode in "${modes[@]}"; do
    for i in $(seq "$rounds"); do
      [ -n "$(resume_s "resume.$mode.w$world.$i")" ] ||
        { echo "no resuming line:"; cat "$out/resume.$mode.w$world.$i.log"; exit 1; }
    done
    zs=$(for i in $(seq "$rounds"); do resume_s "resume.$mode.w$world.$i"; done | med)
    rs=$(for i in $(seq "$rounds"); do resumed_s "resume.$mode.w$world.$i"; done | med)
    ps=$(med < "$out/plain_read.$mode.w$world")
    z=$(gbs "$rank0" "$zs") p=$(gbs "$rank0" "$ps")
    rows_r+=("$(printf "%5s %5s %13d %9.3f %11.3f %8.3f %10.3f %6s %9.3f" "$world" "$mode" "$rank0" "$zs" "$z" "$ps" "$p" "$(pct "$z" "$p")" "$rs")")
  done
  rm -rf "${out:?}/$ck" "${out:?}/$base"

  # Writes: the plain writer, the checkpoint's bytes over WORLD files, in
  # ztrain's pattern.
  per=$((bytes / world)) rot=()
  for r in $(seq 0 $((world - 1))); do rot+=("$out/rot.$r:$n_ck:$t0"); done
  plain rotate "$per" "${rot[@]}" | awk '{ print $1 }' > "$out/plain_rotate.w$world"
  rm -f "$out"/rot.*
  pn=$(med < "$out/plain_rotate.w$world") pb=$(sort -g "$out/plain_rotate.w$world" | head -n 1)
  z=$(gbs "$bytes" "$ck_s") p=$(gbs "$bytes" "$pn")
  rows_w+=("$(printf "%5s %13d %9.3f %11.3f %11s %8.3f %10.3f %11s %6s %6s" "$world" "$bytes" \
    "$ck_s" "$z" "$ck_range" "$pn" "$p" "$(range < "$out/plain_rotate.w$world")" "$(pct "$z" "$p")" \
    "$(pct "$pb" "$zb")")")
done

# Cost to training: WORLD:THREADS per rank. Within each run (runs differ
# by more than a checkpoint costs on this VM): per checkpoint of step c
# (the last one, which nothing follows, aside), the seconds the training
# thread was held plus what steps c+1 .. c+EVERY/2 (while a background
# write runs) took beyond the median of steps c+EVERY/2+1 .. c+EVERY (after
# it); printed: the medians over the checkpoints.
# cost_of RUN: "held excess cost steady_step n" (medians).
cost_of() {
  awk -v every="$every" '
    /"split": "train"/ {
      match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
      match($0, /"step_time_s": [0-9.e+-]+/); t[s] = substr($0, RSTART + 15, RLENGTH - 15) + 0
      if (s > last) last = s
    }
    /"split": "checkpoint"/ {
      match($0, /"step": [0-9]+/); c = substr($0, RSTART + 8, RLENGTH - 8) + 0
      match($0, /"held_s": [0-9.e+-]+/); held[c] = substr($0, RSTART + 10, RLENGTH - 10) + 0
    }
    function median(a, n,   i, j, x) {
      for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    END {
      ns = 0
      for (c in held) if (c + every <= last) for (s = c + every / 2 + 1; s <= c + every; s++) steady[++ns] = t[s]
      base = median(steady, ns)
      n = 0
      for (c in held) {
        if (c + every > last) continue
        x = 0
        for (s = c + 1; s <= c + every / 2; s++) x += t[s] - base
        n++; h[n] = held[c]; e[n] = x; k[n] = held[c] + x
      }
      printf "%.3f %.3f %.3f %.4f %d\n", median(h, n), median(e, n), median(k, n), base, n
    }' "$out/$1/metrics.jsonl"
}
cost_steps=$((3 * every + every / 2))
for config in 1:2 1:1 2:1; do
  world=${config%:*} threads=${config#*:} tag=w${config/:/t}
  ours "inline.$tag" "inline.$tag" "$world" "$every" "$cost_steps" --set device.threads="$threads" \
    --set train.checkpoint_write=in_step
  ours "bg.$tag" "bg.$tag" "$world" "$every" "$cost_steps" --set device.threads="$threads" \
    --set train.checkpoint_write=background
  read -r i_held i_excess i_cost _ _ <<< "$(cost_of "inline.$tag")"
  read -r b_held b_excess b_cost t0 n <<< "$(cost_of "bg.$tag")"
  [ "$(ck_field "bg.$tag" | awk '$4 == "true"' | wc -l)" -gt 0 ] ||
    { echo "no checkpoint overlapped training:"; cat "$out/bg.$tag/metrics.jsonl"; exit 1; }
  copy=$(ck_field "bg.$tag" | awk '$4 == "true" { print $5 }' | range)
  per100() { awk -v c="$1" -v b="$t0" 'BEGIN { printf "+%.1f%%", c / b }'; }
  rows_c+=("$(printf "%5s %7s %9.3f %8s %8s %9s %8s %8s %11s %8s %9s %3s" "$world" "$threads" "$t0" \
    "$i_held" "$i_cost" "$(per100 "$i_cost")" "$b_held" "$b_excess" "$copy" "$b_cost" \
    "$(per100 "$b_cost")" "$n")")
  rm -rf "${out:?}/inline.$tag" "${out:?}/bg.$tag"
done

printf "gpt2-124m, fp32, 1 x 64 tokens per rank and step, %s steps with a checkpoint after each\n" "$steps"
printf "scratch %s on %s (%s); GB = 1e9 bytes\n" "$out" "$(df --output=source "$out" | tail -n 1)" "$fstype"
echo
echo "write: ztrain's checkpoints against plain writes of the same bytes in the same pattern (medians"
echo "and ranges of the seconds over the $steps files; ratios of the medians' and of the fastest files' GB/s)"
printf "%5s %13s %9s %11s %11s %8s %10s %11s %6s %6s\n" world bytes "ztrain s" "ztrain GB/s" \
  range "plain s" "plain GB/s" range ratio best
printf "%s\n" "${rows_w[@]}"
echo
echo "read: rank 0 of ztrain --resume against plain reads of the same files (a reader per rank);"
echo "medians of $rounds resumes and $rounds plain reads"
$cold || echo "(the page cache could not be dropped: all reads are warm, for both)"
echo "(ztrain s: reading and checking the state; resumed s: the whole resume, the strategy's placing"
echo "of the state included)"
printf "%5s %5s %13s %9s %11s %8s %10s %6s %9s\n" world cache "rank 0 bytes" "ztrain s" "ztrain GB/s" \
  "plain s" "plain GB/s" ratio "resumed s"
printf "%s\n" "${rows_r[@]}"
echo
echo "cost of a checkpoint in runs of $cost_steps steps (one every $every): seconds the training thread"
echo "was held, plus what the $((every / 2)) steps after it took beyond the run's steady step time (the"
echo "median of the steps in the second half of each interval); medians over n checkpoints; 1 per 100: a"
echo "checkpoint every 100 steps as a share of their time. copy: the background run's host copies (the"
echo "first pays for fresh pages)"
printf "%5s %7s %9s %8s %8s %9s %8s %8s %11s %8s %9s %3s\n" world threads "step s" "inl held" "inl cost" \
  "1 per 100" "bg held" "bg slow" "bg copy s" "bg cost" "1 per 100" n
printf "%s\n" "${rows_c[@]}"
