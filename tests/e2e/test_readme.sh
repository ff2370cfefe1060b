#!/usr/bin/env bash
# Every command of the README works as written, in order, as a new user
# would type them from the Quick start on: in a scratch copy of the
# repository (configs/, and build/bin/ztrain beside a `ztrain` on PATH), so
# one command's outputs are the next one's inputs (a second training into
# runs/default, a checkpoint to resume). Steps are cut down by shrinking the
# default run's model in the copy, so step numbers (step_300) stay true.
#
# The commands this test does not run are listed below with why (the build
# that CI itself runs, a GPU, other hosts, what another test runs); a
# command in the README that is neither run nor listed fails the test, so a
# new one cannot go unchecked.
#
# usage: test_readme.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

work="$scratch/repo"
mkdir -p "$work/build/bin" "$scratch/path"
cp -r "$SRC/configs" "$work/configs"
ln -s "$ZTRAIN" "$work/build/bin/ztrain"
ln -s "$ZTRAIN" "$scratch/path/ztrain"
# The default run's model, tiny: its 300 steps take a second or two.
python3 - "$work/configs/run.toml" << 'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
for key, value in {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 64, "seq_len": 16}.items():
    text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    assert n == 1, key
open(path, "w").write(text)
PY

# The README's commands: lines of its code blocks that start with a
# command, continuation lines joined, from the Quick start on; "#" comments
# dropped. Printed as LINE<TAB>COMMAND.
python3 - "$SRC/README.md" > "$scratch/commands" << 'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
start = next(i for i, l in enumerate(lines) if l.startswith("## Quick start"))
starts = ("ztrain ", "build/bin/ztrain ", "/opt/ztrain/", "/tmp/zt/", "mpirun ", "torchrun ",
          "cmake ", "ctest ", "scripts/", "$ ")
fenced = False
i = start
while i < len(lines):
    line = lines[i]
    if line.startswith("```"):
        fenced = not fenced
        i += 1
        continue
    text = line.strip()
    if (fenced or line.startswith("    ")) and text.startswith(starts):
        first = i + 1
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        text = re.sub(r"\s+#.*$", "", text)
        print(f"{first}\t{text}")
    i += 1
PY

# skip PATTERN REASON: README commands matching PATTERN (grep -E) are not run.
skips=()
skip() { skips+=("$1"$'\t'"$2"); }
skip '^scripts/install-deps.sh && cmake --preset ci' "the CI command: this test runs inside it"
skip '^cmake |^ctest |^scripts/install-deps.sh && cmake --preset release && cmake --build --preset release &&$' \
  "building and installing: CI has built this binary"
skip '^\$ ztrain ' "the offload example's transcripts: tests/e2e/test_offload.sh runs them (nvme_path in a scratch disk)"
skip 'device.kind=cuda' "needs a GPU (bench/gpu_check.sh runs the CUDA path on one)"
skip '^torchrun ' "torchrun is not installed; tests/e2e/test_env_launch.sh starts ranks as it does"
skip '^ztrain .*--llamafactory examples/' "LLaMA-Factory checkout's YAMLs: tests/e2e/test_llamafactory.sh runs them from one (tests/data/llamafactory/lf_repo)"
skip '^/opt/ztrain/bin/ztrain --hostfile' "needs the hosts of a hostfile; tests/e2e/test_multihost.sh runs one across namespaces"
skip '^/tmp/zt/bin/ztrain ' "needs the SDK installed and the example built: tests/e2e/test_sdk_install.sh does both and runs it"
skip '\[|RUN\.toml|RUN_DIR|OUT ' "a synopsis with placeholders"
skip '^ztrain compare --strategies zero3,zero3_offload,zero3_nvme' "three 19M-parameter jobs, 90 s: tests/e2e/test_compare.sh runs the same out-of-memory, offload and nvme_path comparison on a small model"
skip '^ztrain configs/examples/llama_nvme.toml' "a 4.6B-parameter model: 60 GiB of swap files and minutes a step (bench/bench_largest.sh trains it; tests/e2e/test_nvme.sh checks its estimate)"
skip '^ztrain prepare --tokenizer Llama' "a model's tokenizer and the user's corpus: tests/e2e/test_prepare.sh runs prepare on tests/data's"
skip '^ztrain sft-check --dataset-dir data ' "a model directory and datasets of the user's: tests/e2e/test_sft_check.sh runs sft-check on tests/data's"
skip '^ztrain prepare --dataset-dir data ' "a model directory and datasets of the user's: tests/e2e/test_llamafactory.sh runs prepare --dataset on tests/data's"

skipped_by() {
  local s
  for s in "${skips[@]}"; do
    if grep -Eq -- "${s%%$'\t'*}" <<< "$1"; then
      echo "${s#*$'\t'}"
      return
    fi
  done
}

ran=0
while IFS=$'\t' read -r line command; do
  # The quick start builds, then trains: CI has built; the training is run.
  command=${command#scripts/install-deps.sh && cmake --preset release && cmake --build --preset release && }
  why=$(skipped_by "$command")
  if [ -n "$why" ]; then
    echo "README:$line: not run ($why): $command"
    continue
  fi
  case "$command" in
    ztrain* | build/bin/ztrain*) ;;
    *) fail "README:$line: a command this test neither runs nor lists as skipped: $command" ;;
  esac
  ran=$((ran + 1))
  if ! (cd "$work" && PATH="$scratch/path:$PATH" bash -c "$command") < /dev/null > "$scratch/step$ran.out" 2>&1; then
    fail "README:$line: '$command' failed: $(tail -n 3 "$scratch/step$ran.out")"
  fi
  echo "README:$line: ok: $command"
done < "$scratch/commands"
[ "$ran" -ge 8 ] || fail "only $ran README commands ran (the extraction lost some?)"
# What the commands left is what the README says they leave.
[ "$(cat "$work/runs/ckpt/latest")" = step_400 ] || fail "the resumed run did not reach step 400 in runs/ckpt"
[ -f "$work/out.safetensors" ] || fail "the export wrote no out.safetensors"
echo "PASS ($ran README commands run)"
