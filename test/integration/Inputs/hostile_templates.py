"""Writes tokenizer folders whose chat templates are hostile: each is Qwen3's
tokenizer.json and tokenizer_config.json with another chat_template.

    hostile_templates.py QWEN3_MODELS_DIR OUT_DIR

OUT_DIR/<name>/ for: deep (statements nested 10,000 deep), parens (an
expression nested 10,000 deep), chain (100,000 additions in a row),
doubling (a string doubled 64 times), loops (two nested loops of 100,000),
empty (a template that renders nothing).
"""
import json
import os
import shutil
import sys

src, out = sys.argv[1], sys.argv[2]
TEMPLATES = {
    "deep": "{% if true %}" * 10000 + "x" + "{% endif %}" * 10000,
    "parens": "{{ " + "(" * 10000 + "1" + ")" * 10000 + " }}",
    "chain": "{{ " + " + ".join(["1"] * 100000) + " }}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
             "{% endfor %}{{ messages[0]['content'] }}",
    # Not hostile, just empty: a prompt that renders to nothing.
    "empty": "{% if false %}{{ messages[0]['content'] }}{% endif %}",
}
config = json.load(open(os.path.join(src, "tokenizer_config.json")))
for name, template in TEMPLATES.items():
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "tokenizer.json"), d)
    config["chat_template"] = template
    json.dump(config, open(os.path.join(d, "tokenizer_config.json"), "w"))
