#!/usr/bin/env python3
"""TensorBoard's own reader on a ztrain run's event files: a development check.

Loads RUN_DIR/tensorboard (or the directory given) with TensorBoard's
EventAccumulator, lists the scalar tags, and compares train/loss and val/loss
at every step with the run's metrics.jsonl (relative 1e-6: the events hold
float32). Needs `pip install tensorboard`; CI reads the files with its own
decoder (tests/unit/test_tensorboard.cpp, tests/e2e/test_tensorboard.sh).

    python3 tools/check_tensorboard.py RUN_DIR
"""

import json
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    run = Path(sys.argv[1])
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    print("tags:", ", ".join(tags))
    metrics = [json.loads(line) for line in open(run / "metrics.jsonl")]
    for tag, split in (("train/loss", "train"), ("val/loss", "val")):
        want = {m["step"]: m["loss"] for m in metrics if m["split"] == split}
        got = {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}
        if set(got) != set(want):
            raise SystemExit(f"{tag}: steps {sorted(got)} in the events, {sorted(want)} logged")
        for step, value in got.items():
            if abs(value - want[step]) > 1e-6 * abs(want[step]):
                raise SystemExit(f"{tag} at step {step}: {value} in the events, {want[step]} logged")
        print(f"{tag}: {len(got)} steps, as metrics.jsonl")


if __name__ == "__main__":
    main()
