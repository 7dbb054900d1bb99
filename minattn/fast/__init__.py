"""The annex: every speed trick of minattn, one file per trick, each joined to the core at named
sites.

The core (engine, ops, nn, optim, attention, models) is the textbook algorithm. It lets a faster
form take over in three ways, and this is the one inventory of every site (file: function):

``faster(plain_form)`` — the annex's registered form of one thing (``engine.register_faster``), or
the plain form itself on the textbook path or when none is registered:

    engine.py: Tensor.backward                  faster(Accumulation)          accumulate.py
    ops/matmul.py: matmul, linear               faster(MatMul), faster(Linear)  grouped.py
    ops/indexing.py: getitem, SplitHeads.forward  faster(GetItem)             slices.py
    ops/fused.py: layer_norm                    faster(LayerNorm)             grouped.py
    optim.py: Optimizer.step                    faster(Optimizer.update_each) flat.py
    optim.py: clip_grad_norm                    faster(clip_grad_norm_each)   flat.py
    nn.py: Module.repeated                      faster(applied_each_time)     shared_layer.py
    attention/geometric.py: GeometricAttention.forward  faster(DirectionalLogits)  geometric.py
    attention/geometric.py: geometric_attention_weights faster(GeometricWeights)   (GPU tier only)
    models/encoder.py: CopyGateLayer.forward    faster(residual_norm), faster(linear_relu_dropout),
                                                faster(gated_mix)             (GPU tier only)

``if not is_plain(): fused else: composed`` — a fused op of the core beside its composed definition
(nanoGPT's ``if self.flash``); the fused op is core, not annex, and the tests run both:

    ops/fused.py: softmax, log_softmax, cross_entropy, layer_norm
    ops/indexing.py: split_heads, merge_heads
    attention/geometric.py: geometric_attention_weights (GeometricWeights), GeometricAttention.forward
                            (DirectionalLogits)

``self.once(name, make)`` — derived weights built once per pass of a layer applied n times
(shared_layer.py supplies the cache; plain: rebuilt at every application):

    attention/geometric.py: GeometricAttention.forward   once("in_projection")
    models/encoder.py: CopyGateLayer.forward             once("first_layers")

The GPU tier (``kernels*.py``: CUDA kernels beside their NumPy definitions, off unless
MINATTN_KERNELS=1, and then only on CuPy float32 data) takes over at six of the ``faster`` sites above:
GeometricWeights and DirectionalLogits (kernels_geometric.py), and LayerNorm, residual_norm,
linear_relu_dropout and gated_mix (kernels_layer.py); where it replaces a grouped form (DirectionalLogits,
LayerNorm), its kernel keeps the grouped weight gradients. kernels.py's header is its table.

Each file says what it saves and gives the number ``make bench`` measured. Launches are the counting
device's estimate of what CuPy would launch (minattn/tools/counting.py); on an H200 the annex took
NDR's paper-preset training step from 137.2 to 60.1 ms (RESULTS.md, the first GPU run).

The annex imports only the core, except geometric.py and kernels_geometric.py, the files that know a
mechanism (NDR's geometric attention).
``MINATTN_PLAIN=1`` in the environment (or ``engine.plain()`` in code) switches all of it off: plain
accumulation, one parameter at a time, composed forms, nothing shared. tests/test_plain_vs_fast.py
shows that both paths are the same library. To delete this folder, also delete the one line of the
library that imports it, ``from . import fast`` in minattn/__init__.py: the library then runs the
plain forms. The other wings know the GPU tier by name (lab/settings.py records its switch in a
checkpoint; tools/counting.py and tools/gpucheck.py count and check its kernels) and would go with it.
"""
from . import accumulate, flat, geometric, grouped, shared_layer, slices  # noqa: F401  (each registers)
from . import kernels  # noqa: F401,E402  (the GPU tier: registers its forms only with MINATTN_KERNELS=1)
