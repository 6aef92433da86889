"""Float32 safetensors files for the independent Python references
(seqcls_reference.py, hf_arch_reference.py): written and read with struct
and json only, so the references share no code with hflow's C++ reader.
"""
import json
import struct
import sys

import torch


# ------------------------------------------------------------ safetensors --
def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        t = t.detach().to(torch.float32).contiguous()
        data = struct.pack("<%df" % t.numel(), *t.flatten().tolist())
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit("%s: the references read F32 tensors only, %s is %s" % (path, name, info["dtype"]))
        a, b = info["data_offsets"]
        vals = struct.unpack("<%df" % ((b - a) // 4), raw[base + a:base + b])
        out[name] = torch.tensor(vals, dtype=torch.float64).reshape(info["shape"])
    return out


# ------------------------------------------------------------------ model --
