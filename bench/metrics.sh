# Sourced by the bench scripts: reading a run's metrics.jsonl under $out.

# median RUN FIELD: the median of FIELD over the training steps from the
# third on (the first pays for page faults and warm-up).
median() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n +3 |
    sed -n "s/.*\"$2\": \([-0-9.e+]*\).*/\1/p" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
