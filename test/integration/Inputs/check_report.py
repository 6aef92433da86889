"""Checks an hflow report: the page (argv[1]) is self-contained, the DOM
headless Chromium rendered from it (argv[2]) holds the charts with their
lines, and the screenshot Chromium took (argv[3], a PNG of argv[4] x
argv[5] pixels) is an image of that size with something drawn on it.
Prints one line of counts; exits non-zero naming what is wrong."""
import re
import struct
import sys
import zlib

page = open(sys.argv[1], encoding="utf-8").read()
dom = open(sys.argv[2], encoding="utf-8").read()
png = open(sys.argv[3], "rb").read()
width, height = int(sys.argv[4]), int(sys.argv[5])

# Self-contained: nothing fetched, nothing run.
for bad in ("<script", "<link", "src=", "href=", "url(", "@import", "<iframe", "<img"):
    if bad in page.lower():
        sys.exit(f"the page has '{bad}': it must not load or run anything")

# The rendered DOM: every chart a figure with an SVG, its series polylines.
figures = re.findall(r'<figure class="chart" data-keys="([^"]*)">', dom)
svgs = dom.count("<svg")
polylines = len(re.findall(r'<polyline class="series"', dom))
points = len(re.findall(r'<circle class="point"', dom))
if not figures or svgs != len(figures):
    sys.exit(f"{len(figures)} chart figures and {svgs} svg elements in the rendered DOM")
keys = " ".join(figures).split()
for need in ("reward_mean", "eval_reward", "kl_loss", "response_length", "sft_loss", "pg_loss",
             "entropy", "pg_clipfrac", "iteration_ms", "reshard_bytes", "reshard_ms"):
    if need not in keys:
        sys.exit(f"no chart draws {need} (charts: {figures})")
for title in ("Reward", "KL", "Response length", "Losses", "Entropy", "Clip fractions",
              "Iteration and stage time", "Weight reshard bytes", "Weight reshard time"):
    if f">{title}" not in dom:
        sys.exit(f"no chart titled {title}")
if "<table class=\"summary\">" not in dom:
    sys.exit("no summary table")
rows = len(re.findall(r"<tr><td>", dom))

# The screenshot: a PNG of the window's size whose pixels are not all one colour.
if png[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit("the screenshot is not a PNG")
w, h, depth, ctype = struct.unpack(">IIBB", png[16:26])
if (w, h) != (width, height):
    sys.exit(f"the screenshot is {w} x {h}, not {width} x {height}")
idat, pos = b"", 8
while pos < len(png):
    n, kind = struct.unpack(">I4s", png[pos:pos + 8])
    if kind == b"IDAT":
        idat += png[pos + 8:pos + 8 + n]
    pos += 12 + n
raw = zlib.decompress(idat)
distinct = len(set(raw[i:i + 3] for i in range(0, min(len(raw), 3_000_000), 3)))
if distinct < 20:
    sys.exit(f"the screenshot has {distinct} distinct pixel values: nothing drawn")
print(f"page {len(page)} bytes, self-contained; rendered: {len(figures)} charts, "
      f"{polylines} lines, {points} points, {rows} summary rows; screenshot {w} x {h}, "
      f"{distinct} distinct pixel values")
