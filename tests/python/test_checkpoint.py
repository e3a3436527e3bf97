"""tandem.load_checkpoint: a tiny run's checkpoint in its shapes, equal to what `tandem export
--format hf` writes of it; damaged and missing files refused with the commands' messages."""
import os
import subprocess

import numpy as np
import pytest

import tandem

TINY = dict(model="tiny", dp=1, tp=1, batch=4, seq_len=32, eval_every=0, executor="plan", quiet=True)


def command():
    path = os.environ.get("TANDEM_COMMAND")
    if not path:
        pytest.skip("TANDEM_COMMAND (the tandem command, which ctest gives) is not set")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run") / "ck"
    r = tandem.train(**TINY, steps=2, save=folder)
    return r["checkpoint"]


def test_a_checkpoint_loads_in_its_models_shapes(checkpoint):
    w = tandem.load_checkpoint(checkpoint)
    d, vocab, seq = 64, 256, 32  # --model tiny's width, the synthetic corpus's bytes, --seq-len
    assert w["wte.weight"].shape == (vocab, d) and w["wpe.weight"].shape == (seq, d)
    assert w["h.0.attn.c_attn.weight"].shape == (d, 3 * d)
    assert w["h.1.mlp.c_proj.weight"].shape == (4 * d, d)
    assert w["ln_f.bias"].shape == (d,)
    assert len(w) == 2 + 2 * 12 + 2  # embeddings, 12 tensors a block, ln_f
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in w.values())
    # A --save folder reads as its newest checkpoint.
    series = tandem.load_checkpoint(os.path.dirname(checkpoint))
    assert all(np.array_equal(series[k], w[k]) for k in w)


def test_the_hf_export_holds_the_same_weights(checkpoint, tmp_path):
    out = tmp_path / "hf"
    subprocess.run([command(), "export", checkpoint, "--format", "hf", "--out", str(out)],
                   check=True, capture_output=True)
    w = tandem.load_checkpoint(checkpoint)
    hf = tandem.load_checkpoint(out)
    # GPT2LMHeadModel's names; the tied LM head is wte and not stored.
    assert sorted(hf) == sorted("transformer." + k for k in w)
    for k, a in w.items():
        assert np.array_equal(hf["transformer." + k], a), k


def test_missing_and_damaged_checkpoints_get_the_commands_message(checkpoint, tmp_path):
    def refusals(path):
        with pytest.raises(tandem.Error) as e:
            tandem.load_checkpoint(path)
        p = subprocess.run([command(), "export", str(path), "--format", "hf", "--out",
                            str(tmp_path / "out")], capture_output=True, text=True)
        assert p.returncode == 1
        return str(e.value), p.stderr.strip().removeprefix("tandem: error: ")

    mine, theirs = refusals(tmp_path / "nowhere")
    assert "nowhere" in mine and mine == theirs
    # One byte of a weight changed: its checksum no longer matches.
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", checkpoint, str(damaged)], check=True)
    with open(damaged / "weights.safetensors", "r+b") as f:
        f.seek(-5, os.SEEK_END)
        byte = f.read(1)
        f.seek(-5, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    mine, theirs = refusals(damaged)
    assert "does not match its checksum" in mine and mine == theirs
    # A Hugging Face folder whose config.json is not JSON.
    bad = tmp_path / "bad_hf"
    bad.mkdir()
    (bad / "config.json").write_text("{")
    with pytest.raises(tandem.Error, match="config.json' is not valid JSON"):
        tandem.load_checkpoint(bad)
