// Writes a deterministic corpus of strings for the tokenizer oracle tests,
// one JSON string per line:
//
//   node tokenizer_corpus.js OUT.jsonl COUNT SEED
//
// Every string is valid UTF-8 (the `tokenizers` library takes Rust strings):
// multilingual text, code, emoji (ZWJ sequences, flags, skin tones), runs of
// whitespace of every kind, numbers, contractions, special tokens written as
// text (whole and cut), decomposed accents (NFC matters), control
// characters, noncharacters, private-use and random code points of every
// plane, and mixtures of all of these.
'use strict';
const fs = require('fs');

const [out, countArg, seedArg] = process.argv.slice(2);
if (!out || !countArg) {
  console.error('usage: node tokenizer_corpus.js OUT.jsonl COUNT [SEED]');
  process.exit(2);
}
const count = parseInt(countArg, 10);

// xorshift64*: the same corpus for the same seed everywhere.
let state = BigInt(seedArg || 1) * 0x9E3779B97F4A7C15n & 0xFFFFFFFFFFFFFFFFn || 1n;
function next() {
  state ^= state >> 12n;
  state ^= (state << 25n) & 0xFFFFFFFFFFFFFFFFn;
  state ^= state >> 27n;
  return Number(((state * 0x2545F4914F6CDD1Dn) & 0xFFFFFFFFFFFFFFFFn) >> 11n) / 2 ** 53;
}
const int = (n) => Math.floor(next() * n);
const pick = (a) => a[int(a.length)];

const text = [
  'The quick brown fox jumps over the lazy dog.',
  "It's what they'd've wanted, isn't it? I'LL SEE, you'RE right, we'Ve done.",
  'Le cœur a ses raisons que la raison ne connaît point.',
  'Über den Wolken muss die Freiheit wohl grenzenlos sein. Straße, Größe, Äpfel.',
  '¿Dónde está la biblioteca? ¡Está aquí, señor!',
  'Быстрая коричневая лиса прыгает через ленивую собаку.',
  'Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.',
  'שלום עולם, מה שלומך היום?',
  'مرحبا بالعالم، كيف حالك اليوم؟ ١٢٣٤٥',
  'नमस्ते दुनिया, आप कैसे हैं? १२३',
  'สวัสดีชาวโลก วันนี้เป็นอย่างไรบ้าง',
  '你好，世界！今天天气很好。我们一起去公园散步吧。',
  '日本語のテキスト：東京は日本の首都です。ひらがなとカタカナ。',
  '안녕하세요 세계! 오늘 날씨가 좋네요.',
  'Tiếng Việt có dấu: Người ta nói rằng.',
  'Türkçe: Işık, ılık, İstanbul, ğüşiöç.',
  'ქართული ენა, Հայերեն լեզու, አማርኛ ቋንቋ',
  'Ελληνικά και English mixed με 中文 and العربية together.',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒜𝓁𝓅𝒽𝒶 ∀x∈ℝ: x² ≥ 0 ∑ᵢ aᵢ ≈ ∞',
  'Ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ　ＡＢＣ１２３',
  'ﬁﬂﬀ ligatures, ① ② ③, Ⅻ, ½ ¼, ™ ©',
];
const code = [
  'def f(x):\n    return x ** 2  # square\n',
  'for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n',
  'const x = {a: 1, "b": [2, 3]}; // comment\r\n',
  '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); }',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name;',
  '<div class="x">&amp; &lt;tag&gt;</div>',
  '    if (a && b || !c) { return; }\n\n\n',
  '$ echo "hello" | grep -E \'^h.*o$\' > /dev/null 2>&1',
  'x = [1, 2, 3]\ny = {k: v for k, v in zip("abc", x)}',
  'fn main() -> Result<(), Box<dyn Error>> { Ok(()) }',
];
const emoji = [
  '😀', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇯🇵', '🇺🇸🇬🇧', '❤️', '🧑🏿‍🚀', '🫠', '✨🔥💯',
  '👩🏻‍💻', '🤷‍♀️', '⚽️', '🐈‍⬛', '©️', '1️⃣', '🏴󠁧󠁢󠁳󠁣󠁴󠁿',
];
const spaces = [
  ' ', '  ', '   ', '\t', '\n', '\r\n', '\n\n', ' \n ', '\u00a0', '\u3000', '\u2028',
  '\u2003', '\u200b', '\u0085', '\u000b\u000c', '\t\t  \n', '     \n\n    ', '\r',
];
const numbers = [
  '0', '7', '42', '123', '1234', '12345', '1234567890123', '3.14159', '-0.5',
  '1,000,000', '1e-10', '0x1F', '2024-11-24', '12:30:45', '$19.99', '100%',
  '٣٤٥', '१२३', '１２３',
];
const specials = [
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|begin_of_text|>',
  '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>', '<s>', '</s>',
  '<unk>', '<think>', '</think>', '<tool_call>', '[INST]', '[/INST]',
  '<|im_sta', 'rt|>', '<|', '|>', '<<|im_end|>>', '<|im_start|><|im_end|>',
];
const odd = [
  'e\u0301', 'a\u0308o\u0308u\u0308', '\u1100\u1161\u11a8', 'n\u0303',
  '\u0000', '\u0001\u0002\u001f', '\u007f', '\ufffd', '\ufeff', '\ufffe',
  '\uffff', '\u{10ffff}', '\u{e000}', '\u{f8ff}', '\u{1d11e}', '\u{20000}',
  '\u{e0041}', '\u200d', '\u200e\u200f', '\u0300', 'Ã©', 'Ã¼Ã', 'â€™',
  '\u{1f3fb}', '\u0345', 'ǅ', 'ß', 'ſ', 'İ', 'ΐ',
];

function randomCodePoint() {
  for (;;) {
    const r = next();
    let cp;
    if (r < 0.3) cp = 0x20 + int(0x5f);
    else if (r < 0.5) cp = 0x80 + int(0x780);
    else if (r < 0.8) cp = 0x800 + int(0xf800);
    else cp = 0x10000 + int(0x100000);
    if (cp >= 0xd800 && cp <= 0xdfff) continue; // not a scalar value
    return String.fromCodePoint(cp);
  }
}

function fragment() {
  const r = next();
  if (r < 0.25) return pick(text);
  if (r < 0.35) return pick(code);
  if (r < 0.45) return pick(emoji);
  if (r < 0.55) return pick(spaces);
  if (r < 0.65) return pick(numbers);
  if (r < 0.72) return pick(specials);
  if (r < 0.80) return pick(odd);
  if (r < 0.90) {
    let s = '';
    for (let k = 1 + int(8); k > 0; --k) s += randomCodePoint();
    return s;
  }
  // A word cut at a random place.
  const t = pick(text);
  const cps = Array.from(t);
  const a = int(cps.length), b = a + int(cps.length - a + 1);
  return cps.slice(a, b).join('');
}

const lines = [];
// Every fragment alone first, so each is checked at least once.
for (const list of [text, code, emoji, spaces, numbers, specials, odd])
  for (const f of list) lines.push(f);
lines.push('');
while (lines.length < count) {
  let s = '';
  for (let k = 1 + int(6); k > 0; --k) {
    s += fragment();
    if (next() < 0.5) s += pick([' ', '', '\n', ' ', '  ']);
  }
  lines.push(s);
}
fs.writeFileSync(out, lines.slice(0, count).map((s) => JSON.stringify(s)).join('\n') + '\n');
