"""Primitive differentiable operations: a ``Function`` subclass each, forward and backward side by
side.

Every op works on raw NumPy/CuPy arrays; ``xp = array_module(x)`` picks the module when an op must
create an array. Backward functions never write into ``gy`` (the engine may have handed the same
array to several nodes). Broadcasting is undone once, in the engine (``sum_to``), so binary ops
simply return gradients of the broadcast shape. One room per kind of op, read in this order:

    elementwise.py   add, mul, ..., exp, tanh, sigmoid, relu, where, straight-through
    reductions.py    sum, mean, max, cumsum
    matmul.py        matmul and linear (x @ W + b as one node)
    indexing.py      reshape, transpose, slicing and gathers (segment sums), attention heads, concat,
                     stack, embedding
    fused.py         softmax, log_softmax, cross-entropy, layer norm: each fused op beside its composed form

``from minattn import ops; ops.softmax(...)`` reaches all of them.
"""
from .elementwise import (Abs, Add, AddScalar, ClampMin, Div, Exp, Log, LogSigmoid, MaskedFill,
                          Maximum,  # noqa: F401
                          Minimum, Mul, MulScalar, Neg, PowScalar, ReLU, Sigmoid, Softplus, Sqrt,
                          StraightThrough,
                          Sub, Tanh, Where, abs, add, div, exp, log, logsigmoid, masked_fill,
                          maximum, minimum, mul,
                          neg, pow, relu, sigmoid, softplus, sqrt, straight_through, sub, tanh, where)
from .fused import (CrossEntropy, LayerNorm, LogSoftmax, Softmax, cross_entropy,
                    cross_entropy_composed,  # noqa: F401
                    layer_norm, layer_norm_composed, log_softmax, log_softmax_composed, softmax,
                    softmax_composed)
from .indexing import (ONEHOT_MAX_ROWS, BroadcastTo, Concat, Embedding, GetItem, MergeHeads,  # noqa: F401
                       Reshape, SplitHeads, Stack, SwapAxes, Transpose, broadcast_to, check_ids,
                       concat, embedding,
                       getitem, merge_heads, merge_heads_composed, reshape, segment_sum,
                       split_heads,
                       split_heads_composed, stack, swapaxes, transpose)
from .matmul import Linear, MatMul, linear, matmul  # noqa: F401
from .reductions import Cumsum, Max, Mean, Sum, cumsum, max, mean, sum  # noqa: F401
