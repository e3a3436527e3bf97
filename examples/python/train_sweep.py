"""A learning-rate sweep driven from Python: `tandem train` run once per rate with its flags as
keywords, each step's metrics collected by a callback, a run whose loss goes bad stopped early by
raising from it, and the rates compared at the end.

    PYTHONPATH=build/release/python python3 examples/python/train_sweep.py [--steps N]
"""
import argparse
import math
import tempfile

import tandem


class Diverging(Exception):
    """Raised by the callback to stop a run whose loss has gone bad."""


def train_at(lr, steps, save):
    """Trains the tiny preset at `lr`; returns each step's loss, or None where it was stopped."""
    losses = []

    def on_step(metrics):  # what the --metrics file's line for the step holds
        losses.append(metrics["loss"])
        if metrics["loss"] is None or (len(losses) > 3 and metrics["loss"] > 2 * losses[0]):
            raise Diverging(f"lr {lr:g}: loss {metrics['loss']} at step {metrics['step']}")

    try:
        # One rank each (dp=1, tp=1), no validation, the summary only: a few seconds a run.
        result = tandem.train(model="tiny", dp=1, tp=1, steps=steps, lr=lr, warmup=steps // 5,
                              eval_every=0, seed=7, save=save, quiet=True, callback=on_step)
    except Diverging as e:
        print(f"  stopped: {e}")
        return None
    assert result["losses"] == losses  # the callback saw every step the run took
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for lr in (1e-3, 3e-3, 1e-2):
            print(f"lr {lr:g}:")
            runs[lr] = train_at(lr, args.steps, f"{tmp}/lr-{lr:g}")
        finished = {lr: l for lr, l in runs.items() if l is not None}
        print(f"\n{'lr':>8} {'first loss':>11} {'last loss':>10}")
        for lr, losses in finished.items():
            print(f"{lr:>8g} {losses[0]:>11.4f} {losses[-1]:>10.4f}")
        best = min(finished, key=lambda lr: finished[lr][-1])
        print(f"\nbest: lr {best:g}; its checkpoint's tensors:")
        weights = tandem.load_checkpoint(f"{tmp}/lr-{best:g}")
        for name in ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.weight"):
            print(f"  {name}: {weights[name].shape}")
        assert all(math.isfinite(l) for l in finished[best])


if __name__ == "__main__":
    main()
