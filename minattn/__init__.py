"""minattn: a minimal NumPy/CuPy autograd library and the attention mechanisms of papers on
systematic generalization. The library is this package: read backend, engine, ops, functional, nn,
optim, gradcheck, attention/*, models/*, data/* (then fast/, the speed annex, optional). Running
experiments is a wing of its own, minattn/lab/ (recipes, run directory, settings, report, pictures,
the command line), and the instruments are minattn/tools/ (bench, gpucheck, the PyTorch twin, the
operation counter); the library never imports either (the README's reading order says what each file
holds)."""
from . import backend, functional, nn, optim  # noqa: F401
from . import fast  # noqa: F401,E402  (the annex: registers its faster forms; MINATTN_PLAIN=1 turns it off)
from .engine import Function, Tensor, eval_mode, is_grad_enabled, is_training, no_grad  # noqa: F401

__version__ = "0.1.0"
