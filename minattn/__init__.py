"""minattn: a minimal NumPy/CuPy autograd library and the attention mechanisms of papers on
systematic generalization. Read the code in this order: backend, engine, ops, functional, nn,
optim, gradcheck, (fast: the speed annex, optional), attention/*, models/*, data/*, recipes/*, rundir,
settings, report, viz; then tasks.py and train.py at the top level (the README's reading order says what
each holds)."""
from . import backend, functional, nn, optim  # noqa: F401
from . import fast  # noqa: F401,E402  (the annex: registers its faster forms; MINATTN_PLAIN=1 turns it off)
from .engine import Function, Tensor, eval_mode, is_grad_enabled, is_training, no_grad  # noqa: F401

__version__ = "0.1.0"
