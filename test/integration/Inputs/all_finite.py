"""Reads every *.safetensors file under the folders given (struct and json,
no hflow code) and fails naming the first tensor holding a NaN or an
infinity; prints how many tensors it checked."""
import json
import math
import os
import struct
import sys

FORMATS = {"F32": ("f", 4), "F64": ("d", 8)}
checked = 0
for root in sys.argv[1:]:
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".safetensors"):
                continue
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
                data = f.read()
            for tname, info in header.items():
                if tname == "__metadata__" or info["dtype"] not in FORMATS:
                    continue
                code, size = FORMATS[info["dtype"]]
                a, b = info["data_offsets"]
                values = struct.unpack("<%d%s" % ((b - a) // size, code), data[a:b])
                if not all(map(math.isfinite, values)):
                    sys.exit("%s: tensor %s holds a non-finite value" % (path, tname))
                checked += 1
print("all finite: %d tensors" % checked)
