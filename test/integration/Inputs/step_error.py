"""Reads the 'measured / predicted: A to B over N rows (median M)' line of
two hflow-run summaries (before and after calibration), checks that both
cover the same modelled rows with finite, positive ratios, and prints both
medians. How close the calibrated prediction comes is not checked: the
second run's times are measured on a machine that may be busy, so no bound
on them holds everywhere (docs/cost-model.md reports the figures)."""
import math
import re
import sys


def median_of(path):
    m = re.search(r"measured / predicted: ([0-9.e+-]+) to ([0-9.e+-]+) over (\d+) (?:steps|rows) "
                  r"\(median ([0-9.e+-]+)\)", open(path).read())
    if not m:
        sys.exit(f"{path}: no 'measured / predicted' line")
    lo, hi, med = float(m.group(1)), float(m.group(2)), float(m.group(4))
    for v in (lo, hi, med):
        if not (math.isfinite(v) and v > 0):
            sys.exit(f"{path}: a ratio that is not a positive number: {m.group(0)}")
    if not lo <= med <= hi:
        sys.exit(f"{path}: the median is outside the range: {m.group(0)}")
    return med, int(m.group(3))


before, n1 = median_of(sys.argv[1])
after, n2 = median_of(sys.argv[2])
if n1 != n2:
    sys.exit(f"{n1} modelled rows before, {n2} after")
print(f"{n1} modelled rows: median measured/predicted {before:.3g} before calibration, "
      f"{after:.3g} after")
