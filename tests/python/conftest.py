"""What the Python suites share: PyTorch, imported when python3-torch is installed (a test that needs
it then runs, and fails if the import does) and skipped with the reason otherwise."""
import importlib.util

import pytest


def need_torch():
    """The torch module, or a skip naming the package to install."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (Debian: python3-torch; scripts/install-deps.sh)")
    import torch

    return torch
