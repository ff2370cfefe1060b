#!/usr/bin/env bash
# [train] tensorboard: a run's event file read back (by a stdlib decoder of
# TensorFlow's TFRecord framing and Event fields, the CRC-32C computed here)
# against the run's metrics.jsonl: every logged step's loss, lr, grad norm
# and tokens/s, every tier's peak memory, the val losses, zeros included.
# A resumed run adds a second file beside the first, which stays whole;
# another run into a directory holding event files is refused, and
# --overwrite replaces them.
# tensorboard_dir with tensorboard = false is refused naming the key.
#
# usage: test_tensorboard.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

run() {  # run OUT_NAME ARGS...
  local out=$1
  shift
  "$ZTRAIN" --model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32 \
    --set train.global_batch_size=4 --set train.steps=12 --set train.log_every=4 --set train.eval_every=6 \
    --set train.checkpoint_every=6 --set device.threads=1 --set train.out_dir="$scratch/run" \
    --set train.tensorboard=true "$@" "$SRC/configs/run.toml" > "$scratch/$out.out" 2>&1 ||
    fail "training failed: $(tail -5 "$scratch/$out.out")"
}
run first
python3 - "$scratch/run" <<'PY' || fail "the event file does not hold the run's scalars"
import glob, json, struct, sys

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = shift = 0
    while True:
        v |= (b[i] & 0x7F) << shift
        shift += 7
        i += 1
        if b[i - 1] < 0x80:
            return v, i

def fields(b):  # (number, value) of a message: varint, fixed64, bytes, fixed32
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(b, i)
        elif wire == 1:
            v, i = struct.unpack_from("<d", b, i)[0], i + 8
        elif wire == 5:
            v, i = struct.unpack_from("<f", b, i)[0], i + 4
        else:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        yield num, v

def events(path):
    b = open(path, "rb").read()
    i = 0
    while i < len(b):
        n, = struct.unpack_from("<Q", b, i)
        assert struct.unpack_from("<I", b, i + 8)[0] == masked(b[i:i + 8]), "length CRC"
        data = b[i + 12:i + 12 + n]
        assert struct.unpack_from("<I", b, i + 12 + n)[0] == masked(data), "record CRC"
        i += 16 + n
        e = {"values": {}}
        for num, v in fields(data):
            if num == 2: e["step"] = v
            if num == 3: e["version"] = v.decode()
            if num == 5:
                for _, value in fields(v):
                    f = dict(fields(value))
                    e["values"][f[1].decode()] = f[2]
        yield e

files = sorted(glob.glob(sys.argv[1] + "/tensorboard/events.out.tfevents.*"))
assert len(files) == 1, files
ev = list(events(files[0]))
assert ev[0]["version"] == "brain.Event:2", ev[0]
metrics = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
train = [m for m in metrics if m["split"] == "train"]
val = [m for m in metrics if m["split"] == "val"]
got_train = [e for e in ev[1:] if "train/loss" in e["values"]]
got_val = [e for e in ev[1:] if "val/loss" in e["values"]]
assert [e["step"] for e in got_train] == [m["step"] for m in train], (got_train, train)
assert [e["step"] for e in got_val] == [m["step"] for m in val]
close = lambda a, b: abs(a - b) <= 1e-6 * max(abs(b), 1e-30)
for e, m in zip(got_train, train):
    v = e["values"]
    for tag, key in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                     ("train/tokens_per_s", "tokens_per_s"), ("train/step_time_s", "step_time_s"),
                     ("comm/bytes_sent", "bytes_sent"), ("comm/wait_s", "comm_wait_s")]:
        assert close(v[tag], m[key]), (tag, v[tag], m[key])
    for tier, peak in m["peak_bytes"].items():
        assert close(v["memory/%s_peak_bytes" % tier], peak["total"]), tier
for e, m in zip(got_val, val):
    assert close(e["values"]["val/loss"], m["loss"])
print("tensorboard:", len(got_train), "train events,", len(got_val), "val events, match metrics.jsonl")
PY
first=$(ls "$scratch/run/tensorboard")
cp "$scratch/run/tensorboard/$first" "$scratch/first_events"
run resumed --resume --set train.steps=18
[ "$(ls "$scratch/run/tensorboard" | wc -l)" = 2 ] || fail "a resumed run did not add its own file"
cmp "$scratch/first_events" "$scratch/run/tensorboard/$first" || fail "the resumed run changed the first file"
echo "resume: a second event file, the first unchanged"
# Another run into the same tensorboard_dir is refused; --overwrite replaces
# the event files (and the run) instead of mixing them.
if "$ZTRAIN" --model gpt2-tiny --set train.steps=2 --set train.out_dir="$scratch/other" \
  --set "train.tensorboard_dir=\"$scratch/run/tensorboard\"" "$SRC/configs/run.toml" \
  > "$scratch/mixed.out" 2>&1; then
  fail "a second run into a tensorboard_dir holding event files was not refused"
fi
grep -qF "already holds 2 event file(s) of another run" "$scratch/mixed.out" ||
  fail "not said: $(cat "$scratch/mixed.out")"
run overwritten --overwrite
[ "$(ls "$scratch/run/tensorboard" | wc -l)" = 1 ] || fail "--overwrite left the old event files"
echo "another run's event files: refused, replaced with --overwrite"
if "$ZTRAIN" --model gpt2-tiny --set train.tensorboard=false --set 'train.tensorboard_dir="x"' \
  "$SRC/configs/run.toml" > "$scratch/refused.out" 2>&1; then
  fail "tensorboard_dir with tensorboard = false: not refused"
fi
grep -qF "[train] tensorboard_dir is given with tensorboard = false" "$scratch/refused.out" ||
  fail "not said: $(cat "$scratch/refused.out")"
echo "PASS"
