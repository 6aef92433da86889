"""The calculator example's files (examples/calculator.hflow).

  python3 make_data.py OUT_DIR

Writes, deterministically (fixed seeds):
  tokenizer/tokenizer.json, tokenizer/tokenizer_config.json
      a small byte-level BPE tokenizer (the 256 byte symbols, a few merges
      that make the role names one token each, and the chat's special
      tokens) with a ChatML-style chat template in which a tool's result is
      its own turn: <|im_start|>tool\\nRESULT<|im_end|>\\n
  calc_train.jsonl   2,000 problems a*b (a in 100..999, b in 10..99) as
                     chats, {"prompt": [{"role": "user", "content":
                     "347*29="}], "answer": "10063"}
  calc_eval.jsonl    200 held-out problems, none of them in calc_train
  calc_warmup.jsonl  the supervised warm-up's worked examples, two per
                     training problem: the first turn, answered directly
                     (4 in 5: the right product, which a model this size
                     cannot learn to work out) or by calling the
                     calculator ("<tool_call>347*29</tool_call>", 1 in
                     5); and the second turn after the calculator's
                     result, which is the answer.
"""
import json
import os
import random
import sys

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL = ["<tool_call>", "</tool_call>"]  # text, not special: they stay in decoded text
WORDS = ["user", "assistant", "tool", "system"]
TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def byte_symbols():
    """GPT-2's byte-to-unicode table: the symbol each byte is written as."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tokenizer(out):
    vocab = {s: i for i, s in enumerate(byte_symbols())}
    merges = []
    for w in WORDS:
        for k in range(2, len(w) + 1):
            if w[:k] not in vocab:
                merges.append(w[:k - 1] + " " + w[k - 1])
                vocab[w[:k]] = len(vocab)
    added = []
    for t in SPECIAL + TOOL:
        added.append({"id": len(vocab), "content": t, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": t in SPECIAL})
        vocab[t] = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    with open(os.path.join(out, "tokenizer", "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    cfg = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "bos_token": None, "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return len(vocab)


def problems(rng, count, exclude):
    seen, rows = set(exclude), []
    while len(rows) < count:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append((a, b))
    return rows


def user(a, b):
    return [{"role": "user", "content": "%d*%d=" % (a, b)}]


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 make_data.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    vocab = tokenizer(out)
    train = problems(random.Random(1), 2000, [])
    held = problems(random.Random(2), 200, train)
    write(os.path.join(out, "calc_train.jsonl"),
          [{"prompt": user(a, b), "answer": str(a * b)} for a, b in train])
    write(os.path.join(out, "calc_eval.jsonl"),
          [{"prompt": user(a, b), "answer": str(a * b)} for a, b in held])
    rng, warm = random.Random(3), []
    for a, b in train:
        call = "<tool_call>%d*%d</tool_call>" % (a, b)
        first = call if rng.random() < 0.2 else str(a * b)
        warm.append({"prompt": user(a, b), "answer": first})
        warm.append({"prompt": user(a, b) + [{"role": "assistant", "content": call},
                                             {"role": "tool", "content": str(a * b)}],
                     "answer": str(a * b)})
    rng.shuffle(warm)
    write(os.path.join(out, "calc_warmup.jsonl"), warm)
    print("%s: a tokenizer of %d words; %d training problems, %d held out, %d warm-up rows"
          % (out, vocab, len(train), len(held), len(warm)))


if __name__ == "__main__":
    main()
