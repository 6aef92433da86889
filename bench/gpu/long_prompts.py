#!/usr/bin/env python3
"""The GRPO benchmark's prompts (bench/gpu/grpo.hflow): COUNT arithmetic
questions ("a+b=", answer a+b) each after a fixed preamble that brings the
prompt to LENGTH bytes (the byte tokenizer: LENGTH tokens). Deterministic.

  long_prompts.py OUT.jsonl [COUNT] [LENGTH]      (default 64, 512)
"""
import json
import os
import sys

out = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 64
length = int(sys.argv[3]) if len(sys.argv) > 3 else 512
preamble = "Read the question to its end, then answer with the number alone. "
with open(out + ".part", "w") as f:
    for i in range(count):
        a, b = (i * 37) % 50, (i * 91) % 50
        q = "%d+%d=" % (a, b)
        body = (preamble * (length // len(preamble) + 1))[:length - len(q)]
        f.write(json.dumps({"prompt": body + q, "answer": str(a + b)}) + "\n")
os.replace(out + ".part", out)
