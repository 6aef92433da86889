// Hugging Face's own Rust `tokenizers` (the Node binding
// @anush008/tokenizers) as the oracle for hflow's tokenizer.json reader.
//
//   node tokenizer_oracle.js expect TOKENIZER_JSON CORPUS > expected.jsonl
//       one line per corpus line: {"ids", "text", "text_keep"}: encode
//       without special tokens added, decode skipping / keeping specials
//   node tokenizer_oracle.js compare CORPUS EXPECTED IDS TEXT TEXT_KEEP STREAM NFC
//       compares hflow-tokenize's outputs with the oracle's line by line,
//       checks decode(encode(s)) == s (== NFC(s) when NFC is "nfc"; not at
//       all when it is "none"), and
//       that the streaming pieces join to the decoded text; prints a
//       summary and the first mismatches; exit status 1 on any mismatch
//   node tokenizer_oracle.js bench TOKENIZER_JSON CORPUS REPEAT
//       encodes the corpus REPEAT times in one batch per pass, on one thread
//       (set RAYON_NUM_THREADS=1), and prints the MB/s of the best pass
//
// The package is found under $HFLOW_NPM_REFS/node_modules.
'use strict';
const fs = require('fs');
const path = require('path');

function oracle() {
  const refs = process.env.HFLOW_NPM_REFS;
  if (!refs) {
    console.error('tokenizer_oracle.js: HFLOW_NPM_REFS is not set (tools/hflow-dev refs installs the references)');
    process.exit(2);
  }
  return require(path.join(refs, 'node_modules', '@anush008', 'tokenizers'));
}

const readLines = (f) =>
  fs.readFileSync(f, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));

async function expect(tokJson, corpus) {
  const { Tokenizer } = oracle();
  const tok = Tokenizer.fromFile(tokJson);
  const out = [];
  for (const s of readLines(corpus)) {
    const enc = await tok.encode(s, null, { addSpecialTokens: false });
    const ids = Array.from(enc.getIds());
    out.push(JSON.stringify({
      ids,
      text: await tok.decode(ids, true),
      text_keep: await tok.decode(ids, false),
    }));
  }
  process.stdout.write(out.join('\n') + '\n');
}

function compare(corpusF, expectedF, idsF, textF, keepF, streamF, nfc) {
  const corpus = readLines(corpusF), expected = readLines(expectedF);
  const ids = readLines(idsF), text = readLines(textF), keep = readLines(keepF);
  const stream = readLines(streamF);
  const n = corpus.length;
  for (const [name, a] of [['expected', expected], ['ids', ids], ['text', text],
                           ['text_keep', keep], ['stream', stream]])
    if (a.length !== n) {
      console.log(`FAIL: ${name} has ${a.length} lines for ${n} corpus lines`);
      process.exit(1);
    }
  const bad = { ids: 0, text: 0, text_keep: 0, roundtrip: 0, stream: 0 };
  const shown = [];
  const show = (kind, i, a, b) => {
    bad[kind]++;
    if (shown.length < 10)
      shown.push(`  ${kind} line ${i + 1}: input ${JSON.stringify(corpus[i])}\n` +
                 `    hflow:  ${JSON.stringify(a)}\n    oracle: ${JSON.stringify(b)}`);
  };
  let bytes = 0, tokens = 0;
  for (let i = 0; i < n; ++i) {
    const e = expected[i];
    bytes += Buffer.byteLength(corpus[i]);
    tokens += e.ids.length;
    if (JSON.stringify(ids[i].ids) !== JSON.stringify(e.ids)) show('ids', i, ids[i].ids, e.ids);
    if (text[i].text !== e.text) show('text', i, text[i].text, e.text);
    if (keep[i].text !== e.text_keep) show('text_keep', i, keep[i].text, e.text_keep);
    const want = nfc === 'nfc' ? corpus[i].normalize('NFC') : corpus[i];
    if (nfc !== 'none' && keep[i].text !== want) show('roundtrip', i, keep[i].text, want);
    if (stream[i].pieces.join('') !== text[i].text) show('stream', i, stream[i].pieces, text[i].text);
  }
  console.log(`${n} strings, ${bytes} bytes, ${tokens} tokens`);
  for (const k of Object.keys(bad)) console.log(`${k} mismatches: ${bad[k]}`);
  if (shown.length) console.log(shown.join('\n'));
  process.exit(Object.values(bad).some((v) => v > 0) ? 1 : 0);
}

async function bench(tokJson, corpus, repeat) {
  const { Tokenizer } = oracle();
  const tok = Tokenizer.fromFile(tokJson);
  const lines = readLines(corpus);
  let all = [];
  for (let r = 0; r < repeat; ++r) all = all.concat(lines);
  const bytes = all.reduce((s, l) => s + Buffer.byteLength(l), 0);
  let best = Infinity;
  for (let pass = 0; pass < 3; ++pass) {
    const t0 = process.hrtime.bigint();
    await tok.encodeBatch(all, { addSpecialTokens: false });
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    best = Math.min(best, secs);
  }
  console.log(`oracle: encoded ${bytes} bytes in ${best.toFixed(3)} s: ${(bytes / best / 1e6).toFixed(2)} MB/s`);
}

const [mode, ...args] = process.argv.slice(2);
if (mode === 'expect') expect(args[0], args[1]);
else if (mode === 'compare') compare(...args);
else if (mode === 'bench') bench(args[0], args[1], parseInt(args[2] || '1', 10));
else {
  console.error('usage: node tokenizer_oracle.js expect|compare|bench ...');
  process.exit(2);
}
