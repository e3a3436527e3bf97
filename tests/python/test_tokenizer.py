"""tandem.Tokenizer against the ids Hugging Face's tokenizers and SentencePiece give for the texts
of tests/data (goldens.json beside each tokenizer), and round trips."""
import json
import os

import pytest

import tandem

DATA = os.path.join(os.path.dirname(__file__), "..", "data")


def goldens(kind):
    with open(os.path.join(DATA, kind, "goldens.json"), encoding="utf-8") as f:
        return json.load(f)


def test_llama2_tokenizer_json_matches_hugging_face():
    g = goldens("llama2")
    t = tandem.Tokenizer(os.path.join(DATA, "llama2", "tokenizer.json"))
    assert t.vocab_size == 32000 and t.bos_id == g["bos"] and t.sha256 == g["sha256"]
    for case in g["cases"]:
        assert t.encode(case["text"]) == case["ids"], case["text"]
        assert t.decode(case["ids"]) == case["decoded"], case["text"]


def test_llama2_sentencepiece_model_matches_sentencepiece():
    g = goldens("llama2")
    t = tandem.Tokenizer(os.path.join(DATA, "llama2", "tokenizer.model"))
    assert (t.bos_id, t.eos_id) == (-1, g["model"]["eos"])  # a .model puts no bos before a text
    for text, case in zip((c["text"] for c in g["cases"]), g["model"]["cases"]):
        assert t.encode(text) == case["ids"], text
        assert t.decode(case["ids"]) == case["decoded"], text


def test_llama3_byte_level_bpe_round_trips():
    g = goldens("llama3")
    t = tandem.Tokenizer(os.path.join(DATA, "llama3", "tokenizer.json"))
    for case in g["cases"]:
        ids = t.encode(case["text"])
        assert ids == case["small"], case["text"]
        assert t.decode(ids) == case["small_decoded"], case["text"]
        if "<|" not in case["text"]:  # special tokens decode to nothing; all else comes back
            assert t.decode(ids) == case["text"]


def test_a_cut_character_decodes_to_the_replacement_character():
    t = tandem.Tokenizer(os.path.join(DATA, "llama3", "tokenizer.json"))
    ids = t.encode("é")  # two bytes, each its own byte-level token in this small vocabulary
    assert t.decode(ids) == "é"
    if len(ids) > 1:
        assert t.decode(ids[:1]) == "\ufffd"


def test_missing_and_malformed_files_are_refused(tmp_path):
    with pytest.raises(tandem.Error, match="nowhere.json"):
        tandem.Tokenizer(tmp_path / "nowhere.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(tandem.Error, match="bad.json"):
        tandem.Tokenizer(bad)
