#!/usr/bin/env python3
"""The include graph of the source tree against docs/architecture.md.

The table between the "layers" markers of docs/architecture.md names every
directory of code and the directories its files may include. This check
reads every #include "..." of those directories and fails on:
  - an edge the table does not allow (a layer reaching where it must not);
  - an allowed edge no file uses (the table must say what the code does);
  - a directory of code the table does not name;
  - a cycle among the allowed edges (each layer uses only those below it).
Both include forms count: "..." always, <...> when its first path
component names a directory of the table (<ztrain/x.h>, or <train/x.h>,
which the host's include path would let compile); other <...> headers are
the system's and third parties'. A file's own directory always is allowed.

usage: check_layers.py SOURCE_DIR
"""
import os
import re
import sys

BEGIN, END = "<!-- layers begin -->", "<!-- layers end -->"


def read_table(doc):
    text = open(doc, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        sys.exit(f"{doc}: no layer table between {BEGIN} and {END}")
    rows = {}
    body = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    for n, line in enumerate(body.splitlines()):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        allowed = set(re.findall(r"`([^`]+)`", cells[2]))
        rows[name] = allowed
    return rows


def include_root(inc, own):
    """The directory an include names: its first path component."""
    if "/" not in inc:
        return own
    top = inc.split("/")[0]
    return {"ztrain": "include/ztrain"}.get(top, top)


def scan(src):
    """{directory name: {included directory: [file, ...]}} over the tree."""
    dirs = {"include/ztrain": "framework/include/ztrain", "cuda": "framework/cuda",
            "app": "framework/app", "plugins": "plugins", "strategies": "strategies",
            "examples": "examples"}
    for d in sorted(os.listdir(os.path.join(src, "framework/src"))):
        if os.path.isdir(os.path.join(src, "framework/src", d)):
            dirs[d] = "framework/src/" + d
    edges = {}
    for name, rel in dirs.items():
        edges[name] = {}
        for dp, _, files in os.walk(os.path.join(src, rel)):
            for f in files:
                if not re.search(r"\.(h|cpp|cu|cuh)$", f):
                    continue
                path = os.path.join(dp, f)
                text = open(path, encoding="utf-8").read()
                for m in re.finditer(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', text, re.M):
                    to = include_root(m.group(2), name)
                    # <...> names a system or third-party header unless its
                    # first component is a directory of the table (the
                    # host's include path makes <train/x.h> compile too).
                    if m.group(1) == "<" and to not in dirs and to != "include/ztrain":
                        continue
                    if to != name:
                        edges[name].setdefault(to, []).append(os.path.relpath(path, src))
    return edges


def cycle(rows):
    state = {}

    def visit(n, path):
        state[n] = 1
        for m in sorted(rows.get(n, ())):
            if state.get(m) == 1:
                return path + [n, m]
            if m in rows and not state.get(m):
                found = visit(m, path + [n])
                if found:
                    return found
        state[n] = 2
        return None

    for n in sorted(rows):
        if not state.get(n):
            found = visit(n, [])
            if found:
                return found
    return None


def main():
    src = sys.argv[1]
    doc = os.path.join(src, "docs/architecture.md")
    rows = read_table(doc)
    edges = scan(src)
    problems = []
    for name in sorted(edges):
        if name not in rows:
            problems.append(f"{name}: a directory of code the layer table of docs/architecture.md does not name; add its row")
            continue
        for to, files in sorted(edges[name].items()):
            if to not in rows[name]:
                problems.append(f"{name} may not include {to}, but {files[0]} does"
                                + (f" (and {len(files) - 1} more)" if len(files) > 1 else "")
                                + "; move the code to the layer it belongs to, or change the table with the reason")
        for to in sorted(rows[name] - set(edges[name])):
            problems.append(f"{name}: the table allows {to}, which no file includes; remove it from the row")
    for name in sorted(set(rows) - set(edges)):
        problems.append(f"{name}: named by the layer table but no such directory of code")
    found = cycle(rows)
    if found:
        problems.append("the layer table has a cycle: " + " -> ".join(found))
    for p in problems:
        print("layers: " + p)
    if problems:
        return 1
    count = sum(len(v) for v in edges.values())
    print(f"layers: {len(edges)} directories, {count} allowed edges, every include within them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
