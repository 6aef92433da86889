"""Copies a Hugging Face directory, writing NaN into one element of one
tensor of its model.safetensors and dropping hflow's checksum from the
metadata (as a checkpoint from elsewhere would have none); with
--keep-checksum the checksum stays (the file is then corrupt).

    poison_safetensors.py SRC_DIR DST_DIR TENSOR INDEX [--keep-checksum]
"""
import json
import math
import os
import shutil
import struct
import sys

src, dst, name, index = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
keep = "--keep-checksum" in sys.argv[5:]
shutil.copytree(src, dst)
path = os.path.join(dst, "model.safetensors")
with open(path, "rb") as f:
    blob = f.read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
data = bytearray(blob[8 + n:])
info = header[name]
assert info["dtype"] == "F32", info
begin = info["data_offsets"][0] + 4 * index
data[begin:begin + 4] = struct.pack("<f", math.nan)
if not keep:
    header.get("__metadata__", {}).pop("hflow.fnv1a64", None)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + bytes(data))
