"""Float32 (and bfloat16) safetensors files for the independent Python
references (seqcls_reference.py, hf_arch_reference.py): written and read
with struct and json only, so the references share no code with hflow's C++
reader. A bfloat16 tensor is its 16-bit patterns (torch's bfloat16 view).
"""
import json
import struct
import sys

import torch


# ------------------------------------------------------------ safetensors --
def write_safetensors(path, tensors, dtype="F32"):
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        if dtype == "BF16":
            bits = t.detach().to(torch.bfloat16).contiguous().view(torch.int16)
            data = struct.pack("<%dh" % bits.numel(), *bits.flatten().tolist())
        else:
            t = t.detach().to(torch.float32).contiguous()
            data = struct.pack("<%df" % t.numel(), *t.flatten().tolist())
        header[name] = {"dtype": dtype, "shape": list(t.shape),
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
        a, b = info["data_offsets"]
        if info["dtype"] == "BF16":
            bits = struct.unpack("<%dh" % ((b - a) // 2), raw[base + a:base + b])
            t = torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)
            out[name] = t.to(torch.float64).reshape(info["shape"])
            continue
        if info["dtype"] != "F32":
            sys.exit("%s: the references read F32 and BF16 tensors only, %s is %s" % (path, name, info["dtype"]))
        vals = struct.unpack("<%df" % ((b - a) // 4), raw[base + a:base + b])
        out[name] = torch.tensor(vals, dtype=torch.float64).reshape(info["shape"])
    return out


# ------------------------------------------------------------------ model --
