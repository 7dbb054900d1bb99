"""The annex: every speed trick of minattn, one file per trick, each joined to the core by one seam.

The core (engine, ops, nn, optim) is the textbook algorithm. Where it offers a seam it asks
``engine.faster(plain_form)``; each file here registers its faster form of that one thing with
``engine.register_faster``, says what it saves, and gives the number ``make bench`` measured:

    accumulate.py    how backward adds gradients        faster(engine.Accumulation)
    grouped.py       a shared layer's weight gradients   faster(MatMul / Linear / LayerNorm / DirectionalLogits)
    slices.py        the gradients of a tensor's slices  faster(ops.GetItem)
    flat.py          optimizer step and clipping         faster(Optimizer.update_each / clip_grad_norm_each)
    shared_layer.py  a layer applied n times per pass    faster(nn.applied_each_time)

The fused ops (softmax, log_softmax, cross-entropy, layer norm, geometric attention) live in the core
beside their composed forms (``if not is_plain(): fused, else: composed``, as nanoGPT's ``if self.flash``).

Launches are the counting device's estimate of what CuPy would launch (minattn/tools/counting.py): no trick
here has been timed on a GPU yet (``make gpu-check``, with and without MINATTN_PLAIN=1, would).

``MINATTN_PLAIN=1`` in the environment (or ``engine.plain()`` in code) switches all of it off: plain
accumulation, one parameter at a time, composed forms, nothing shared. tests/test_plain_vs_fast.py
shows that both paths are the same library; a reader may delete this folder and still have one.
"""
from . import accumulate, flat, grouped, shared_layer, slices  # noqa: F401  (each registers itself)
from . import kernels  # noqa: F401,E402  (the GPU tier: registers its forms only with MINATTN_KERNELS=1)
