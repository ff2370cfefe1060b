"""The golden file of DeepSpeed's launcher filters: what DeepSpeed's own
runner keeps of a hostfile's slots for each --include / --exclude string.

Writes tests/data/launcher/filters.json: for each case, the hostfile's hosts
and slot counts, the filter, and DeepSpeed's answer: the hosts it keeps, in
order, with their slot ids in order, or "error" (a ValueError: a host or
slot that is not there, include with exclude), or an empty list (every slot
excluded, which ztrain refuses instead of starting nothing). The filters
run through deepspeed.launcher.runner.parse_inclusion_exclusion, what
`deepspeed --include/--exclude` calls. tests/unit/test_launcher.cpp reads
the file and holds ztrain's filter_hosts to it.

    /work/venv/bin/pip install deepspeed   # CPU-only is enough
    /work/venv/bin/python tools/make_launcher_golden.py   # from the repository root
"""
import collections
import json
import logging
import sys

logging.disable(logging.CRITICAL)
from deepspeed.launcher import runner  # noqa: E402

HOSTFILES = [
    [("w0", 4), ("w1", 4), ("w2", 2)],
    [("gpu004", 8), ("gpu005", 8)],
    [("a", 1)],
    [("node-1", 2), ("node-10", 2), ("node-2", 3)],
]

# Filters over every hostfile: several slots, reordered and repeated slots,
# whole hosts, several hosts, hosts and slots that are not there, both
# filters at once, everything excluded.
FILTERS = {
    0: ["w0", "w1:0", "w0:0,1", "w0:2,0", "w0:1,1", "w0:0,2@w2", "w2@w0", "w1:3@w1:0",
        "w0@w1@w2", "w9", "w0:4", "w2:0,1,2", "w0:0@w0"],
    1: ["gpu004:0,1", "gpu005:7,6,5", "gpu004@gpu005:1", "gpu006", "gpu004:8"],
    2: ["a", "a:0", "a:1", "b"],
    3: ["node-1", "node-10:1", "node-2:0,2@node-1:1", "node-1:0,1@node-10:0,1@node-2:0,1,2"],
}


def deepspeed_answer(hosts, include, exclude):
    pool = collections.OrderedDict((h, n) for h, n in hosts)
    try:
        kept = runner.parse_inclusion_exclusion(pool, include, exclude)
    except (ValueError, KeyError):
        return "error"
    return [[h, list(slots)] for h, slots in kept.items()]


def main():
    cases = []
    for i, hosts in enumerate(HOSTFILES):
        for f in FILTERS[i]:
            for include, exclude in ((f, ""), ("", f)):
                cases.append({"hosts": [[h, n] for h, n in hosts], "include": include,
                              "exclude": exclude,
                              "deepspeed": deepspeed_answer(hosts, include, exclude)})
        both = FILTERS[i][0]
        cases.append({"hosts": [[h, n] for h, n in hosts], "include": both, "exclude": both,
                      "deepspeed": deepspeed_answer(hosts, both, both)})
    import deepspeed
    out = {"generator": "tools/make_launcher_golden.py", "deepspeed": deepspeed.__version__,
           "cases": cases}
    with open("tests/data/launcher/filters.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
