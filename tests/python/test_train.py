"""tandem.train and tandem.plan: the commands' flags as keywords, checked with the commands'
messages; the per-step callback against the metrics file; a raising callback and SIGINT stopping
the run after a step with a checkpoint."""
import json
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import tandem

# A tiny model on one rank, run by the plan executor (no JIT compile): a step takes milliseconds.
TINY = dict(model="tiny", dp=1, tp=1, batch=4, seq_len=32, eval_every=0, executor="plan", quiet=True)


def command_error(*args):
    """The message `tandem ARGS` fails with (stderr, without its "tandem: error: " prefix)."""
    command = os.environ.get("TANDEM_COMMAND")
    if not command:
        pytest.skip("TANDEM_COMMAND (the tandem command, which ctest gives) is not set")
    p = subprocess.run([command, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    return p.stderr.strip().removeprefix("tandem: error: ")


def metrics_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_callback_gets_each_steps_metrics_line(tmp_path):
    seen = []
    # NumPy's numbers and paths are taken as Python's.
    r = tandem.train(**TINY, steps=np.int64(3), metrics=tmp_path / "m.jsonl", callback=seen.append)
    assert seen == metrics_lines(tmp_path / "m.jsonl")  # every field, bit for bit
    assert [m["step"] for m in seen] == [1, 2, 3]
    assert {"loss", "tokens_per_s", "lr", "step_s", "phase_s"} <= seen[0].keys()
    assert r["steps"] == 3 and r["end_step"] == 3 and r["checkpoint"] is None
    assert r["losses"] == [m["loss"] for m in seen] and r["loss"] == seen[-1]["loss"]


def test_a_raising_callback_stops_after_its_step_with_a_checkpoint(tmp_path):
    def stop_at_2(m):
        if m["step"] == 2:
            raise ValueError("enough")

    with pytest.raises(ValueError, match="enough"):
        tandem.train(**TINY, steps=5, save=tmp_path / "ck", metrics=tmp_path / "m.jsonl",
                     callback=stop_at_2)
    assert [m["step"] for m in metrics_lines(tmp_path / "m.jsonl")] == [1, 2]
    assert sorted(os.listdir(tmp_path / "ck")) == ["latest", "step-00000002"]
    # The run resumes from it: the next three steps, and the ones before are not run again.
    r = tandem.train(**TINY, steps=5, resume=tmp_path / "ck", save=tmp_path / "ck")
    assert (r["first_step"], r["end_step"]) == (2, 5)
    assert r["checkpoint"].endswith("step-00000005")


def test_sigint_stops_after_the_step_and_raises_keyboard_interrupt(tmp_path):
    def interrupt(m):
        if m["step"] == 1:
            # As Ctrl-C, at once (to this thread): the trainer's handler takes it.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt, match="stopped by SIGINT after step 1 of 4"):
        tandem.train(**TINY, steps=4, save=tmp_path / "ck", callback=interrupt)
    assert sorted(os.listdir(tmp_path / "ck")) == ["latest", "step-00000001"]
    # Python's own handler is back: Ctrl-C outside a run is Python's KeyboardInterrupt again.
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


def test_sigterm_stops_after_the_step_and_exits_as_the_command_does():
    def terminate(m):
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    with pytest.raises(SystemExit) as e:
        tandem.train(**TINY, steps=3, callback=terminate)
    assert e.value.code == 128 + signal.SIGTERM


def test_unknown_keywords_are_named_together():
    with pytest.raises(tandem.Error, match=r"unknown keywords 'stepz', 'learning_rate':.*tandem train"):
        tandem.train(stepz=3, learning_rate=0.1)
    with pytest.raises(tandem.Error, match="unknown keyword 'help'"):
        tandem.train(help=True)
    with pytest.raises(tandem.Error, match="callback=3 is not callable"):
        tandem.train(**TINY, steps=1, callback=3)
    with pytest.raises(tandem.Error, match=r"steps=\[1, 2\]: give a str, int, float, bool or path"):
        tandem.train(steps=[1, 2])


def as_flags(keywords):
    """The command line the keywords stand for: a flag's name with '_' as '-', True alone."""
    return [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
            for k, v in keywords.items()]


@pytest.mark.parametrize(
    "keywords",
    [
        dict(steps="many"),  # CLI11's conversion
        dict(steps=-1),  # the integer flags' check
        dict(lr=float("nan")),  # the config's check
        dict(tp=3),  # the grid against the heads
        dict(optimizer="sgd"),  # a choice's parser
        dict(arch="gpt3"),  # CLI11's IsMember
        dict(kv_heads=2),  # a Llama field on GPT-2
        dict(resume="/nonexistent/ck"),  # the checkpoint read when the flags are
    ],
)
def test_bad_values_get_the_commands_message(keywords):
    settings = {**TINY, "steps": 1, **keywords}
    with pytest.raises(tandem.Error) as e:
        tandem.train(**settings)
    assert str(e.value) == command_error("train", *as_flags(settings))


def test_plan_across_grids_returns_its_rows():
    rows = tandem.plan(model="tiny", ranks=2, memory_per_rank="2GiB")
    assert rows and sum(r["recommended"] for r in rows) == 1
    assert all(r["dp"] * r["tp"] * r["pp"] * r["cp"] == 2 for r in rows)
    assert [r["step_s"] for r in rows] == sorted(r["step_s"] for r in rows)  # fastest first
    for r in rows:
        parts = ("compute_s", "exchange_s", "io_s", "bubble_s", "cores_s", "update_s",
                 "other_s")
        assert r["step_s"] == sum(r[p] for p in parts)  # the breakdown adds up, in its order
        assert 0 < r["memory_per_rank"] <= 2 << 30
        # The stages' layers: [] for the even split, else one count a stage summing to the layers.
        split = r["stage_layers"]
        assert split == [] or (len(split) == r["pp"] and sum(split) == 2)
        assert r["micro_batches"] >= 1
    # One grid under a memory budget: its out-of-core plan, as the command's report states it.
    [one] = tandem.plan(model="tiny", batch=4, seq_len=32, memory_budget="75%")
    assert (one["dp"], one["tp"], one["pp"]) == (1, 1, 1)
    assert one["activations"] and one["activations"] in one["report"]
    assert one["step_s"] > 0 and one["peak_bytes"] > 0
    with pytest.raises(tandem.Error, match="tandem plan needs --memory-budget"):
        tandem.plan(model="tiny")
    with pytest.raises(tandem.Error, match="unknown keyword 'steps'"):
        tandem.plan(model="tiny", ranks=2, steps=3)  # a train flag, not plan's
