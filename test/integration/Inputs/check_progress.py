"""Checks hflow-run's progress bar in a terminal's output (a `script`
typescript) and its absence in piped output.

usage: check_progress.py TYPESCRIPT PIPED PHASE:N [PHASE:N ...]

In the typescript every iteration but the run's last draws a bar
"\\r\\033[K[phase i/n] |###...| pct% r it/s ETA XmYYs ..." and whatever is
printed next starts by clearing it ("\\r\\033[K"), so no line is written onto
a bar; the run's summary follows. The piped output has no carriage return
and no escape sequence.
"""
import re
import sys

tty = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
piped = open(sys.argv[2], "rb").read().decode("utf-8", "replace")
phases = [(p.split(":")[0], int(p.split(":")[1])) for p in sys.argv[3:]]
CLEAR = "\r\x1b[K"
bar = re.compile(r"\r\x1b\[K\[(\w+) (\d+)/(\d+)\] \|(#*)(\.*)\| +(\d+)% [0-9.]+ it/s ETA \d+m\d\ds")
seen = []
for m in bar.finditer(tty):
    phase, i, n = m.group(1), int(m.group(2)), int(m.group(3))
    width = len(m.group(4)) + len(m.group(5))
    if round(i / n * width) != len(m.group(4)) or int(m.group(6)) != round(100 * i / n):
        sys.exit(f"bar of {phase} {i}/{n} shows {len(m.group(4))}/{width} and {m.group(6)}%")
    # The rest of the bar's line, then what comes next: a clear.
    end = tty.find("\r", m.end())
    if end < 0 or not tty.startswith(CLEAR, end):
        sys.exit(f"output written onto the bar of {phase} {i}/{n}: {tty[m.end():m.end() + 80]!r}")
    seen.append((phase, i))
want = [(p, i) for p, n in phases for i in range(1, n + 1)][:-1]
if seen != want:
    sys.exit(f"bars drawn {seen}, expected {want}")
if "done:" not in tty.split(CLEAR)[-1]:
    sys.exit("the summary does not follow the last bar's clear")
if "\r" in piped or "\x1b" in piped:
    sys.exit("the piped output has a carriage return or an escape sequence")
print(f"{len(seen)} bars, each cleared before the next output; piped output plain")
