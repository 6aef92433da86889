"""Reads the 'measured / predicted: A to B over N rows (median M)' line of
two hflow-run summaries (before and after calibration) and checks that the
calibrated plan predicts this machine's steps within a factor of 2 (median)
where the first was off by more. Prints both medians."""
import re
import sys


def median_of(path):
    m = re.search(r"measured / predicted: ([0-9.e+-]+) to ([0-9.e+-]+) over (\d+) (?:steps|rows) "
                  r"\(median ([0-9.e+-]+)\)", open(path).read())
    if not m:
        sys.exit(f"{path}: no 'measured / predicted' line")
    return float(m.group(4)), int(m.group(3))


before, n1 = median_of(sys.argv[1])
after, n2 = median_of(sys.argv[2])
if n1 != n2:
    sys.exit(f"{n1} modelled steps before, {n2} after")
err = lambda r: max(r, 1 / r)
if not (err(after) <= 2.0):
    sys.exit(f"after calibration the median step is off by x{err(after):.3g} (median {after:.3g})")
if not (err(after) < err(before)):
    sys.exit(f"calibration did not help: x{err(before):.3g} before, x{err(after):.3g} after")
print(f"{n1} modelled rows: median measured/predicted {before:.3g} before calibration, "
      f"{after:.3g} after (within a factor of 2)")
