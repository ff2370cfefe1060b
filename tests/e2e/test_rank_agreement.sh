#!/usr/bin/env bash
# Ranks that disagree on the configuration stop before anything is built.
# Two ranks started separately, the second with one key changed (model
# shape, strategy, steps, learning rate, seed), must both exit with the
# config error naming that key and both values, within seconds, and write
# no weights; over tcp (torchrun-style) and under mpirun (MPMD). The same
# value reached two ways (0.001 from one rank's --set, 1e-3 from the
# other's) agrees and trains. Ranks that load different builds of a plugin
# stop too, naming it (a byte-identical copy under another path agrees);
# so do ranks whose data files (the same path in different working
# directories) differ or are missing on one host. Initial weights
# (init_from) that only rank 0's host has reach the other ranks from rank 0
# and train as a world-1 run from the same file.
#
# usage: test_rank_agreement.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=3 --set train.eval_every=0 --set device.threads=1)

# tcp_pair NAME RANK1_ARGS...: rank 0 with the common arguments, rank 1 with
# RANK1_ARGS too, started in $dir0 and $dir1; their exit statuses in $s0
# and $s1.
dir0=$PWD dir1=$PWD
tcp_pair() {
  local name=$1 p0 p1
  shift
  reserve_port
  (cd "$dir0" && RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" \
    "${common[@]}" --set train.out_dir="$scratch/$name" "$SRC/configs/run.toml") \
    > "$scratch/$name.0.out" 2>&1 &
  p0=$!
  (cd "$dir1" && RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" \
    "${common[@]}" --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml") \
    > "$scratch/$name.1.out" 2>&1 &
  p1=$!
  spawned+=("$p0" "$p1")
  exit_within "$p0" 60
  s0=$status
  exit_within "$p1" 60
  s1=$status
}

# refused NAME KEY VALUE0 VALUE1: both ranks of NAME exited 2 naming KEY with
# rank 0's and rank 1's values, and no weights were written.
refused() {
  local name=$1 key=$2 v0=$3 v1=$4 r
  for r in 0 1; do
    local s
    s=$([ "$r" -eq 0 ] && echo "$s0" || echo "$s1")
    [ "$s" -eq 2 ] || { cat "$scratch/$name.$r.out" >&2; fail "$name: rank $r exited $s, not 2"; }
    grep -q "the ranks disagree on the configuration: $key is $v0 .* on rank 0 but $v1 .* on rank 1" \
      "$scratch/$name.$r.out" || { cat "$scratch/$name.$r.out" >&2; fail "$name: rank $r did not name $key"; }
  done
  [ ! -e "$scratch/$name/model.safetensors" ] || fail "$name wrote weights"
  echo "$name: $(grep -m1 -o 'the ranks disagree.*on rank 1' "$scratch/$name.0.out")"
}

tcp_pair layers --set model.n_layer=3
refused layers model.n_layer 2 3
tcp_pair width --set model.n_embd=128
refused width model.n_embd 64 128
tcp_pair strategy --strategy zero2
refused strategy strategy.plugin "'ddp'" "'zero2'"
tcp_pair steps --set train.steps=4
refused steps train.steps 3 4
tcp_pair lr --set train.lr=0.002
refused lr train.lr '[0-9.e-]*' 0.002
tcp_pair seed --set train.seed=7
refused seed train.seed '[0-9]*' 7

# The same value written differently agrees.
common+=(--set train.lr=0.001)
tcp_pair same_lr --set train.lr=1e-3
[ "$s0" -eq 0 ] && [ "$s1" -eq 0 ] || { cat "$scratch"/same_lr.*.out >&2; fail "0.001 and 1e-3 disagreed"; }

# Under mpirun, one program per rank.
mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"
status=0
"$mpirun" --allow-run-as-root --oversubscribe --bind-to none \
  -np 1 "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/mpi" "$SRC/configs/run.toml" : \
  -np 1 "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/mpi" --set model.n_head=2 \
  "$SRC/configs/run.toml" > "$scratch/mpi.out" 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "mpirun with disagreeing ranks exited 0"
# Both ranks say it (their lines may interleave on the shared stderr).
said=$(grep -o "the ranks disagree on the configuration: model.n_head is 4 ([^)]*) on rank 0 but 2 (--set model.n_head=2) on rank 1" \
  "$scratch/mpi.out" | wc -l)
[ "$said" -eq 2 ] || { cat "$scratch/mpi.out" >&2; fail "mpi: $said ranks named model.n_head, not 2"; }
for r in 0 1; do
  grep -q "\[rank $r\]" "$scratch/mpi.out" || fail "mpi: rank $r did not report"
done
! grep -qiE "segmentation|bus error|signal" "$scratch/mpi.out" || fail "mpi: a rank crashed: $(cat "$scratch/mpi.out")"
# both_said NAME PATTERN: both ranks of NAME exited 1 (an error, not a
# config error) and said PATTERN (grep).
both_said() {
  local name=$1 pattern=$2 r s
  for r in 0 1; do
    s=$([ "$r" -eq 0 ] && echo "$s0" || echo "$s1")
    [ "$s" -eq 1 ] || { cat "$scratch/$name.$r.out" >&2; fail "$name: rank $r exited $s, not 1"; }
    grep -q "$pattern" "$scratch/$name.$r.out" || { cat "$scratch/$name.$r.out" >&2; fail "$name: rank $r did not say why"; }
  done
}

# The installation: rank 1 loads zero2 from its own copy of the plugin
# file. A byte-identical copy elsewhere agrees and trains; a copy with one
# byte more (another build, as far as the bytes go) stops both ranks naming
# the plugin, both files, both digests and both hosts.
plugins=$(dirname "$ZTRAIN")/../lib/ztrain/plugins
mkdir -p "$scratch/same" "$scratch/rebuilt"
cp "$plugins/libztrain_strategy_zero2.so" "$scratch/same/"
cp "$plugins/libztrain_strategy_zero2.so" "$scratch/rebuilt/"
printf 'x' >> "$scratch/rebuilt/libztrain_strategy_zero2.so"
common+=(--strategy zero2)
tcp_pair plugin_copy --plugin-path "$scratch/same"
[ "$s0" -eq 0 ] && [ "$s1" -eq 0 ] || { cat "$scratch"/plugin_copy.*.out >&2; fail "identical plugin copies disagreed"; }
tcp_pair plugin_rebuilt --plugin-path "$scratch/rebuilt"
both_said plugin_rebuilt "the ranks run different builds: strategy zero2 is '.*/lib/ztrain/plugins/libztrain_strategy_zero2.so' (crc32c [0-9a-f]*, version [0-9.]*) on rank 0 (host .*) but '$scratch/rebuilt/libztrain_strategy_zero2.so' (crc32c [0-9a-f]*, version [0-9.]*) on rank 1 (host .*); install the same"
echo "plugin_rebuilt: $(grep -m1 -o 'the ranks run different builds.*on rank 1 (host [^)]*)' "$scratch/plugin_rebuilt.0.out")"

# The data: each rank reads corpus.txt in its own working directory (as
# hosts without a shared file system would). The same bytes train; one
# byte changed stops both ranks naming the file, both digests and both
# hosts; a rank without the file stops both, naming the path and its host.
mkdir -p "$scratch/host0" "$scratch/host1"
for i in $(seq 1 2000); do echo "line $i of the same corpus"; done > "$scratch/host0/corpus.txt"
cp "$scratch/host0/corpus.txt" "$scratch/host1/corpus.txt"
common+=(--set data.plugin=text --set data.path=corpus.txt --set model.vocab_size=256)
dir0=$scratch/host0 dir1=$scratch/host1
tcp_pair data_same
[ "$s0" -eq 0 ] && [ "$s1" -eq 0 ] || { cat "$scratch"/data_same.*.out >&2; fail "identical data files disagreed"; }
sed -i '1000s/same/SAME/' "$scratch/host1/corpus.txt"
tcp_pair data_changed
both_said data_changed "the ranks read different files: data file is 'corpus.txt' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 0 (host .*) but 'corpus.txt' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 1 (host .*); give every host the same file"
echo "data_changed: $(grep -m1 -o 'the ranks read different files.*on rank 1 (host [^)]*)' "$scratch/data_changed.0.out")"
rm "$scratch/host1/corpus.txt"
tcp_pair data_missing
[ "$s0" -eq 1 ] && [ "$s1" -eq 1 ] || { cat "$scratch"/data_missing.*.out >&2; fail "data_missing: exits $s0 and $s1, not 1 and 1"; }
grep -q "corpus.txt.*(on host .*, rank 1)" "$scratch/data_missing.1.out" ||
  { cat "$scratch/data_missing.1.out" >&2; fail "data_missing: rank 1 did not name the path and its host"; }
grep -q "another rank cannot read its data" "$scratch/data_missing.0.out" ||
  { cat "$scratch/data_missing.0.out" >&2; fail "data_missing: rank 0 did not say why it stopped"; }
echo "data_missing: $(grep -m1 -o 'ztrain: error: .*' "$scratch/data_missing.1.out")"

# Weights only rank 0's host has: init_from names init.safetensors in each
# rank's directory, present in host0's only. Rank 0 reads it and sends each
# parameter; the run logs the losses of a world-1 run from the same file and
# says how the weights travelled. A stale copy on host1 is refused. With the
# file on host1 only, rank 0 (which would read it) says it has none, naming
# its host.
cp "$scratch/host0/corpus.txt" "$scratch/host1/corpus.txt"
(cd "$scratch/host0" && "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/wsrc" \
  "$SRC/configs/run.toml" > "$scratch/wsrc.out" 2>&1) || { cat "$scratch/wsrc.out" >&2; fail "making weights failed"; }
cp "$scratch/wsrc/model.safetensors" "$scratch/host0/init.safetensors"
common+=(--set model.init_from=init.safetensors --set train.log_every=1)
(cd "$scratch/host0" && "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/wref" \
  "$SRC/configs/run.toml" > "$scratch/wref.out" 2>&1) || { cat "$scratch/wref.out" >&2; fail "the world-1 run from the weights failed"; }
curve wref 3
tcp_pair weights_from_0
[ "$s0" -eq 0 ] && [ "$s1" -eq 0 ] || { cat "$scratch"/weights_from_0.*.out >&2; fail "weights_from_0: exits $s0 and $s1"; }
grep -q "weights from init.safetensors (read by rank 0 and sent to ranks that cannot see it: .* moved in" \
  "$scratch/weights_from_0.0.out" || { cat "$scratch/weights_from_0.0.out" >&2; fail "weights_from_0: the header does not say how the weights travelled"; }
curve weights_from_0 3
same_training wref weights_from_0 1e-6 2e-6
echo "weights_from_0: $(grep -m1 -o 'weights from init.safetensors.*' "$scratch/weights_from_0.0.out")"
# A stale copy on host1 (its last byte changed) is refused, not used.
cp "$scratch/host0/init.safetensors" "$scratch/host1/init.safetensors"
printf 'x' | dd of="$scratch/host1/init.safetensors" bs=1 conv=notrunc status=none \
  seek=$(($(stat -c %s "$scratch/host1/init.safetensors") - 1))
tcp_pair weights_stale
both_said weights_stale "the ranks read different files: init_from is 'init.safetensors' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 0 (host .*) but 'init.safetensors' ([0-9]* bytes, sampled crc32c [0-9a-f]*) on rank 1 (host .*)"
mv "$scratch/host0/init.safetensors" "$scratch/host1/init.safetensors"
tcp_pair weights_not_on_0
[ "$s0" -eq 1 ] && [ "$s1" -eq 1 ] || { cat "$scratch"/weights_not_on_0.*.out >&2; fail "weights_not_on_0: exits $s0 and $s1, not 1 and 1"; }
grep -q "init_from: no weights at 'init.safetensors' on rank 0 (host .*), which reads them" \
  "$scratch/weights_not_on_0.0.out" || { cat "$scratch/weights_not_on_0.0.out" >&2; fail "weights_not_on_0: rank 0 did not say it has none"; }

echo "PASS"
