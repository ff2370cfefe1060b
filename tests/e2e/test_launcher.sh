#!/usr/bin/env bash
# The launcher for real: `ztrain --nproc 2` and `ztrain --hostfile` (this
# machine as `localhost slots=2`) train one job of 2 ranks; --env travels to
# the ranks; bad hostfiles and filters fail with their messages.
#
# usage: test_launcher.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v mpirun > /dev/null || fail "mpirun not found (install openmpi-bin)"

tiny=(--set train.steps=4 --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16
  --set train.micro_batch_size=2 --set train.log_every=1)
cd "$scratch"

# Run with the session directory the launcher makes (lib.sh sets a base of
# the script's own, which the launcher would keep): nothing left behind.
mkdir np_tmp
env -u OMPI_MCA_orte_tmpdir_base TMPDIR="$PWD/np_tmp" "$ZTRAIN" --nproc 2 "${tiny[@]}" \
  --set train.out_dir=np "$SRC/configs/run.toml" > np.out 2>&1 ||
  { cat np.out >&2; fail "--nproc 2 failed"; }
[ -z "$(ls -A np_tmp)" ] || fail "--nproc 2 left in TMPDIR: $(ls -A np_tmp)"
grep -q "batch: 2 x 2 accum x 2 ranks = 8 sequences" np.out || fail "--nproc 2 did not run 2 ranks: $(head -3 np.out)"
[ "$(grep -c '^step 4/4' np.out)" -eq 1 ] || fail "more than rank 0 printed progress"
[ -s np/model.safetensors ] || fail "--nproc 2 wrote no weights"

# Open MPI's session directory: a base of the job's own, made before mpirun
# starts and removed after it ends; a base the user set is kept. A stand-in
# mpirun, first on PATH, reports what it was given.
mkdir fakebin own_tmp
cat > fakebin/mpirun << 'EOF'
#!/bin/sh
echo "base=$OMPI_MCA_orte_tmpdir_base" > "$FAKE_MPIRUN_REPORT"
if [ -d "$OMPI_MCA_orte_tmpdir_base" ]; then echo made >> "$FAKE_MPIRUN_REPORT"; fi
EOF
chmod +x fakebin/mpirun
env -u OMPI_MCA_orte_tmpdir_base TMPDIR="$PWD/own_tmp" FAKE_MPIRUN_REPORT="$PWD/report" \
  PATH="$PWD/fakebin:$PATH" "$ZTRAIN" --nproc 2 "$SRC/configs/run.toml" > fake.out 2>&1 ||
  fail "--nproc 2 with the stand-in mpirun: $(cat fake.out)"
base=$(sed -n 's/^base=//p' report)
case "$base" in "$PWD/own_tmp/ztrain-mpi."*) ;; *) fail "session base '$base', expected one under TMPDIR" ;; esac
grep -qx made report || fail "the session base $base did not exist when mpirun started"
[ ! -e "$base" ] || fail "the session base $base outlived the job"
OMPI_MCA_orte_tmpdir_base="$PWD/mine" FAKE_MPIRUN_REPORT="$PWD/report" PATH="$PWD/fakebin:$PATH" \
  "$ZTRAIN" --nproc 2 "$SRC/configs/run.toml" > fake.out 2>&1 || fail "user's base: $(cat fake.out)"
grep -qx "base=$PWD/mine" report || fail "the user's base was not kept: $(cat report)"

printf 'localhost slots=2\n' > hosts
ZTRAIN_TEST_TOKEN=hello "$ZTRAIN" --hostfile hosts --env ZTRAIN_TEST_TOKEN "${tiny[@]}" \
  --set train.out_dir=hf "$SRC/configs/run.toml" > hf.out 2>&1 || { cat hf.out >&2; fail "--hostfile failed"; }
grep -q "x 2 ranks" hf.out || fail "--hostfile did not run 2 ranks"
ZTRAIN_TEST_TOKEN=hello "$ZTRAIN" --hostfile hosts --env ZTRAIN_TEST_TOKEN --dry-run "$SRC/configs/run.toml" > dry.out
grep -q -- "--host localhost:2 .*-np 2 -x ZTRAIN_TEST_TOKEN=hello" dry.out || fail "dry run: $(cat dry.out)"
# Slot ids are GPU ids, per host, as DeepSpeed's launcher gives them: the
# slots named, never the first N.
printf 'gpu004 slots=4
gpu005 slots=2
' > gpus
"$ZTRAIN" --hostfile gpus --include gpu004:1,3@gpu005 --dry-run "$SRC/configs/run.toml" > slots.out
grep -q -- "--host gpu004:2 -np 2 -x ZTRAIN_TERMINAL=0 -x CUDA_VISIBLE_DEVICES=1,3 .* : --host gpu005:2 -np 2 -x ZTRAIN_TERMINAL=0 -x CUDA_VISIBLE_DEVICES=0,1 " \
  slots.out || fail "--include gpu004:1,3: $(cat slots.out)"
"$ZTRAIN" --hostfile gpus --exclude gpu004:0@gpu005 --dry-run "$SRC/configs/run.toml" > slots.out
grep -q -- "--host gpu004:3 -np 3 -x ZTRAIN_TERMINAL=0 -x CUDA_VISIBLE_DEVICES=1,2,3 " slots.out &&
  ! grep -q gpu005 slots.out || fail "--exclude gpu004:0@gpu005: $(cat slots.out)"

expect_error() {  # expect_error PATTERN ARGS...: ztrain fails (status 2) with PATTERN on stderr
  local pattern=$1 status=0
  shift
  "$ZTRAIN" "$@" "$SRC/configs/run.toml" > err.out 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "ztrain $* exited $status, expected 2: $(cat err.out)"
  grep -q -- "$pattern" err.out || fail "ztrain $*: no '$pattern' in: $(cat err.out)"
}
printf 'localhost slots=2\nlocalhost slots=1\n' > dup
expect_error "dup:2: host 'localhost' is listed twice" --hostfile dup --dry-run
printf 'localhost slots=0\n' > zero
expect_error "zero:1: host 'localhost' has slots=0" --hostfile zero --dry-run
printf 'localhost: 2\n' > syntax
expect_error "syntax:1: expected 'hostname slots=N'" --hostfile syntax --dry-run
expect_error "--include: host 'nohost' is not in the hostfile" --hostfile hosts --include nohost --dry-run
expect_error "--exclude: host 'localhost' has no slot 7" --hostfile hosts --exclude localhost:7 --dry-run
# DeepSpeed's --num_nodes/--num_gpus/--master_addr/--master_port.
"$ZTRAIN" --hostfile gpus --num_nodes 1 --num_gpus 2 --master_addr 10.1.2.3 --master_port 29511 \
  --dry-run "$SRC/configs/run.toml" > slots.out
grep -q -- "--host gpu004:2 -np 2 -x MASTER_ADDR=10.1.2.3 -x MASTER_PORT=29511 -x ZTRAIN_TERMINAL=0 -x CUDA_VISIBLE_DEVICES=0,1 " \
  slots.out && ! grep -q gpu005 slots.out || fail "--num_nodes 1 --num_gpus 2: $(cat slots.out)"
expect_error "DeepSpeed refuses them together" --hostfile gpus --num_gpus 1 --include gpu004 --dry-run
expect_error "--num_gpus 3: host 'gpu005' has 2 slot(s)" --hostfile gpus --num_gpus 3 --dry-run
expect_error "--env NO_SUCH_VARIABLE_X: no such variable" --nproc 2 --env NO_SUCH_VARIABLE_X --dry-run
CUDA_VISIBLE_DEVICES=2 expect_error "and the hostfile's slots both choose the GPUs" \
  --hostfile gpus --env CUDA_VISIBLE_DEVICES --dry-run
expect_error "--nproc 0: give 1 or more ranks" --nproc 0
expect_error "go with --nproc, --num_gpus or --hostfile" --include localhost
expect_error "need a --hostfile" --nproc 2 --exclude localhost --dry-run
echo "PASS"
