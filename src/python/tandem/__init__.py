"""tandem from Python: write a distributed step as a DSL program, schedule it, and run it with the
reference interpreter or the compiled executor on NumPy arrays and PyTorch tensors, on in-process
ranks or one process a rank under mpirun. tandem.torch (imported on its own, as it imports
PyTorch): a fused distributed optimizer and a DDP communication hook. See docs/python.md."""
import sys as _sys

from . import _tandem
from ._tandem import *  # noqa: F401,F403 (the extension's classes and functions are the package's)

__all__ = [_n for _n in dir(_tandem) if not _n.startswith("_")]
__doc__ = _tandem.__doc__

# The extension's types print as tandem.X (tandem.Error in a traceback, not tandem._tandem.Error),
# and `import tandem.workloads` finds the extension's submodule.
for _n in __all__:
    _v = getattr(_tandem, _n)
    if isinstance(_v, type) and _v.__module__.startswith("tandem._tandem"):
        try:
            _v.__module__ = "tandem"
        except (AttributeError, TypeError):  # a type that keeps its module
            pass
_sys.modules[__name__ + ".workloads"] = _tandem.workloads
