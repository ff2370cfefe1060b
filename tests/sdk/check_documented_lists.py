#!/usr/bin/env python3
"""Lists docs/architecture.md gives, against the tree they describe.

The fuzz targets: those the Testing section names (`fuzz_*`), the
tests/fuzz/fuzz_*.cpp files, and the targets tests/CMakeLists.txt builds
and replays must be one set, so a new target cannot go unlisted (nor a
listed one be dropped) without this failing.

The source files the documents name: every `room/name` (or `room/name.h`,
`.cpp`) in backticks in docs/*.md and README.md, where room is a directory
of framework/src, must be a file there, so a move leaves no stale path.

usage: check_documented_lists.py SOURCE_DIR
"""
import os
import re
import sys


def main():
    src = sys.argv[1]
    doc = open(os.path.join(src, "docs/architecture.md"), encoding="utf-8").read()
    testing = doc[doc.index("## Testing"):]
    entry = testing[testing.index("- `tests/fuzz/`"):]
    entry = entry[:entry.index("\n- ")]
    documented = set(re.findall(r"`(fuzz_\w+)`", entry))
    files = {f[:-4] for f in os.listdir(os.path.join(src, "tests/fuzz"))
             if f.startswith("fuzz_") and f.endswith(".cpp")}
    cmake = open(os.path.join(src, "tests/CMakeLists.txt"), encoding="utf-8").read()
    loop = re.search(r"foreach\(t ((?:fuzz_\w+ ?)+)\)", cmake)
    built = set(loop.group(1).split()) if loop else set()
    problems = []
    for name, found in (("docs/architecture.md (Testing)", documented),
                        ("tests/CMakeLists.txt's fuzz loop", built)):
        for t in sorted(files - found):
            problems.append(f"fuzz target {t} (tests/fuzz/{t}.cpp) is not in {name}")
        for t in sorted(found - files):
            problems.append(f"{name} names fuzz target {t}, but there is no tests/fuzz/{t}.cpp")
    rooms = sorted(d for d in os.listdir(os.path.join(src, "framework/src"))
                   if os.path.isdir(os.path.join(src, "framework/src", d)))
    pattern = re.compile(r"`((?:%s)/[a-z0-9_]+?)(\.h|\.cpp)?`" % "|".join(rooms))
    named = 0
    for doc_name in sorted(os.listdir(os.path.join(src, "docs"))) + ["../README.md"]:
        path = os.path.join(src, "docs", doc_name)
        if not path.endswith(".md"):
            continue
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            for m in pattern.finditer(line):
                named += 1
                base = os.path.join(src, "framework/src", m.group(1))
                exts = [m.group(2)] if m.group(2) else [".h", ".cpp"]
                if not any(os.path.isfile(base + e) for e in exts):
                    problems.append(f"{os.path.normpath(path)}:{n}: `{m.group(0).strip('`')}` names no file "
                                    f"in framework/src; give the file's current path")
    for p in problems:
        print("documented lists: " + p)
    if problems:
        return 1
    print(f"documented lists: the {len(files)} fuzz targets are documented and built; "
          f"the {named} source paths the documents name exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
