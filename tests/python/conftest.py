"""What the Python suites share: the Adam workload's scalars and random inputs, and PyTorch,
imported when python3-torch is installed (a test that needs it then runs, and fails if the import
does) and skipped with the reason otherwise."""
import importlib.util

import numpy as np
import pytest

ADAM_SCALARS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=3)


def adam_inputs(ranks, n, seed):
    """The adam workload's inputs: a gradient a rank, and the weights and moments."""
    rng = np.random.default_rng(seed)
    return {
        "g": [rng.standard_normal(n, dtype=np.float32) for _ in range(ranks)],
        "w": rng.standard_normal(n, dtype=np.float32),
        "m": rng.standard_normal(n, dtype=np.float32),
        "v": rng.random(n, dtype=np.float32),
    }


def need_torch():
    """The torch module, or a skip naming the package to install."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (Debian: python3-torch; scripts/install-deps.sh)")
    import torch

    return torch
