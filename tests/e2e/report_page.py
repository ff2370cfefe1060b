"""An HTML report of ztrain compare / ztrain report, parsed with the
standard library's html.parser: the verdict banner, the tables' cells, and
each chart (<svg class="chart">) with its axis ranges, plot frame, curves
and lines, so a test can read back the values drawn.

usage (from a test): python3 report_page.py PAGE.html CHECKS.py [ARGS...]
runs CHECKS.py with `page` (a Page) and `argv` (ARGS) in its globals.
"""
import html.parser
import math
import sys


class Page(html.parser.HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.verdict_class, self.verdict_text = None, ""
        self.tables = {}  # id -> {"header": [...], "rows": [[(text, classes)]], "errors": [...]}
        self.charts = {}  # id -> {"attrs", "frame", "curves": {label: [(x, y)]}, "lines", "texts"}
        self.tags = []  # every start tag's name
        self._table = self._row = self._cell = self._chart = None
        self._in_verdict = self._in_text = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if a.get("id") == "verdict":
            self.verdict_class, self._in_verdict = a.get("class", ""), True
        if tag == "table":
            self._table = self.tables.setdefault(a.get("id"), {"header": [], "rows": [], "errors": []})
        elif tag == "tr" and self._table is not None:
            self._row = {"cells": [], "error": "error" in a.get("class", "")}
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ["", a.get("class", "").split(), tag, a]
        elif tag == "svg":
            self._chart = self.charts.setdefault(
                a.get("id"), {"attrs": a, "frame": None, "curves": {}, "lines": [], "texts": [], "rects": []})
        elif self._chart is not None:
            self._chart_tag(tag, a)

    def _chart_tag(self, tag, a):
        c = self._chart
        if tag == "rect" and "frame" in a.get("class", ""):
            c["frame"] = [float(a[k]) for k in ("x", "y", "width", "height")]
        elif tag == "rect":
            c["rects"].append(a)
        elif tag == "polyline":
            pts = [tuple(map(float, p.split(","))) for p in a["points"].split()]
            c["curves"][a["data-label"]] = pts
        elif tag == "line":
            c["lines"].append(a)
        elif tag == "text":
            self._in_text = True
            c["texts"].append("")

    def handle_endtag(self, tag):
        if tag == "p":
            self._in_verdict = False
        if tag in ("td", "th") and self._cell is not None:
            self._row["cells"].append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            cells = self._row["cells"]
            if self._row["error"]:
                self._table["errors"].append((cells[0][0], cells[0][3].get("colspan")))
            elif cells and cells[0][2] == "th":
                self._table["header"] = [c[0] for c in cells]
            elif cells:
                self._table["rows"].append([(c[0], c[1]) for c in cells])
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "svg":
            self._chart = None
        elif tag == "text":
            self._in_text = False

    def handle_data(self, data):
        if self._in_verdict:
            self.verdict_text += data
        if self._cell is not None:
            self._cell[0] += data
        if self._in_text and self._chart is not None:
            self._chart["texts"][-1] += data

    def values(self, chart_id, label):
        """The (x, y) values a curve of a chart draws, read back through its axes."""
        c = self.charts[chart_id]
        x0, x1 = map(float, c["attrs"]["data-x-range"].split())
        y0, y1 = map(float, c["attrs"]["data-y-range"].split())
        fx, fy, fw, fh = c["frame"]
        out = []
        for px, py in c["curves"][label]:
            x = x0 + (px - fx) / fw * (x1 - x0)
            y = y0 + (fy + fh - py) / fh * (y1 - y0)
            out.append((x, 10 ** y if c["attrs"]["data-log-y"] == "1" else y))
        return out


if __name__ == "__main__":
    page = Page(open(sys.argv[1], encoding="utf-8").read())
    checks = open(sys.argv[2]).read() if sys.argv[2] != "-" else sys.stdin.read()
    exec(compile(checks, sys.argv[2], "exec"), {"page": page, "argv": sys.argv[3:], "math": math})
