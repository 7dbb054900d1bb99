"""The annex: every speed trick of minattn, one file per trick, each joined to the core by one seam.

The core (engine, ops, nn, optim, attention, models) is the textbook algorithm. At each site below it
asks ``faster(plain_form, data)`` (minattn/engine.py) and runs what it gets: the plain form on the
CPU (NumPy arrays), where people read and debug, the annex's registered form on other devices (CuPy),
where speed is the point. ``MINATTN_PLAIN=1`` or ``0`` (``engine.plain(on)``) forces either path
everywhere. This is the one inventory:

    site (file: function)                plain form              fast form                file
    engine.py: Tensor.backward           Accumulation            GroupedAccumulation      accumulate.py
    ops/matmul.py: matmul, linear        MatMul, Linear          GroupedMatMul, ..Linear  grouped.py
    ops/fused.py: layer_norm             LayerNorm               GroupedLayerNorm         grouped.py
    ops/indexing.py: getitem, SplitHeads GetItem                 SlicingGetItem           slices.py
    optim.py: Optimizer.step             Optimizer.update_each   update_flat              flat.py
    optim.py: clip_grad_norm             clip_grad_norm_each     clip_grad_norm_flat      flat.py
    nn.py: Module.repeated               applied_each_time       applied_together         shared_layer.py
    attention/geometric.py:              geometric_weights       fused_geometric_weights  geometric.py
      geometric_attention_weights          (Eq. 7, composed)       (GeometricWeights)
    attention/geometric.py:              directional_logits      fused_directional_logits geometric.py
      GeometricAttention.forward           (Eqs. 9–10, composed)   (DirectionalLogits)
    fast/geometric.py                    DirectionalLogits       GroupedDirectionalLogits geometric.py
    nn.py: Module.__call__ (GPU tier)    CopyGateLayer.forward   copy_gate_forward        kernels_layer.py
    fast/geometric.py (GPU tier)         GeometricWeights,       ..Kernel (each)          kernels_geometric.py
                                         DirectionalLogits
    ops/fused.py (GPU tier)              LayerNorm               LayerNormKernel          kernels_layer.py

The GPU tier (the last three rows; ``kernels*.py``: CUDA kernels beside their NumPy definitions) is
off unless MINATTN_KERNELS=1, and then runs only on CuPy float32 data; where it replaces a grouped
form, its kernel keeps the grouped weight gradients. kernels.py's header is its table. What each file
saves is measured in RESULTS.md.

The annex imports only the core, except the files that know NDR (geometric.py, kernels_geometric.py,
kernels_layer.py). tests/library/test_plain_vs_fast.py shows that both paths are the same library. To delete
this folder, also delete the one line of the library that imports it, ``from . import fast`` in
minattn/__init__.py: the library then runs the plain forms. The other wings know the GPU tier by name
(lab/settings.py records its switch in a checkpoint; tools/counting.py and tools/gpucheck.py count and
check its kernels) and would go with it.
"""
from . import accumulate, flat, geometric, grouped, shared_layer, slices  # noqa: F401  (each registers)
from . import kernels  # noqa: F401,E402  (the GPU tier: registers its forms only with MINATTN_KERNELS=1)
