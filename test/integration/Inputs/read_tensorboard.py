"""Reads TensorBoard event files back and checks them against metrics JSONL.

usage: read_tensorboard.py PROTO GENDIR EVENTDIR METRICS.jsonl
       read_tensorboard.py PROTO GENDIR EVENTDIR --steps   (the steps present)

The Event messages are decoded by the protobuf library (classes protoc
generates from PROTO into GENDIR); the TFRecord frames are checked with a
CRC-32C written here, independently of hflow's. Every (tag, step) must
appear once, and every number of every line of METRICS must be in the
files as phase/name at the run's step (iterations counted over the phases
in the order the file lists them), equal to it rounded to float32.
"""
import glob
import json
import os
import struct
import subprocess
import sys

TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = TABLE[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(b):
    c = crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF



def expected_scalars(rows):
    """(tag, step, value, compared) for every number of metrics rows: tag
    PHASE/NAME, step the iteration counted over the phases in the rows'
    order; time_s left out (a resumed run's clock differs), timings and
    counters present but not compared. test/gpu/clients.py reads
    TensorBoard's own reader against the same mapping."""
    order, last = [], {}
    for r in rows:
        if r["phase"] not in last:
            order.append(r["phase"])
        last[r["phase"]] = max(last.get(r["phase"], 0), r["iteration"])
    offset, total = {}, 0
    for p in order:
        offset[p], total = total, total + last[p]
    for r in rows:
        for k, v in r.items():
            if k in ("phase", "iteration", "time_s") or not isinstance(v, (int, float)):
                continue
            timing = (k in ("iteration_ms", "tokens_per_s", "bytes_moved", "reshard_ms", "page_faults")
                      or k.startswith(("ms_step_", "ms_moves_")))
            yield "%s/%s" % (r["phase"], k), offset[r["phase"]] + r["iteration"], v, not timing


def read_events(evdir, tb):
    """{(tag, step): value} of every event file in EVDIR, each frame's CRCs
    checked, and the count of summary events."""
    files = sorted(glob.glob(os.path.join(evdir, "*tfevents*")))
    if not files:
        sys.exit(f"no event file in {evdir}")
    seen = {}
    events = 0
    for path in files:
        data = open(path, "rb").read()
        at, first = 0, True
        while at < len(data):
            (n,) = struct.unpack_from("<Q", data, at)
            (lc,) = struct.unpack_from("<I", data, at + 8)
            if lc != masked(data[at:at + 8]):
                sys.exit(f"{path}: record at {at}: length checksum differs")
            payload = data[at + 12:at + 12 + n]
            (pc,) = struct.unpack_from("<I", data, at + 12 + n)
            if pc != masked(payload):
                sys.exit(f"{path}: record at {at}: payload checksum differs")
            ev = tb.Event()
            ev.ParseFromString(payload)
            if first:
                if ev.WhichOneof("what") != "file_version" or ev.file_version != "brain.Event:2":
                    sys.exit(f"{path}: the first record is not the file version")
                first = False
            elif ev.WhichOneof("what") == "summary":
                events += 1
                for v in ev.summary.value:
                    key = (v.tag, ev.step)
                    if key in seen:
                        sys.exit(f"{path}: {v.tag} at step {ev.step} written twice")
                    seen[key] = v.simple_value
            at += 16 + n
    return seen, events, files


def main():
    proto, gen, evdir, metrics = sys.argv[1:5]
    os.makedirs(gen, exist_ok=True)
    subprocess.run(["protoc", "--python_out=" + gen, "-I", os.path.dirname(proto), proto], check=True)
    sys.path.insert(0, gen)
    import tensorboard_event_pb2 as tb

    seen, events, files = read_events(evdir, tb)
    if metrics == "--steps":
        print("steps:", " ".join(str(s) for s in sorted({s for (_, s) in seen})))
        sys.exit(0)
    rows = [json.loads(line) for line in open(metrics)]
    checked = 0
    for tag, step, v, compared in expected_scalars(rows):
        got = seen.get((tag, step))
        if got is None:
            sys.exit(f"{tag} at step {step} is not in the event files")
        if compared and abs(got - v) > abs(v) * 2.0 ** -23:
            sys.exit(f"{tag} at step {step}: {got} in the event files, {v} in {metrics}")
        checked += 1
    steps = sorted({s for (_, s) in seen})
    print(f"{len(files)} event files, {events} events, {len(seen)} scalars, steps {steps[0]} to "
          f"{steps[-1]}, none twice; {checked} figures of {len(rows)} metrics lines equal")


if __name__ == "__main__":
    main()
