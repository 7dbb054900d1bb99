"""The textbook path and the annex are the same library.

The textbook path (the CPU's by default; ``engine.plain()`` here) runs the core as written: out-of-place
gradient sums, one parameter at a time, geometric attention's composed equations, nothing shared between
the applications of a shared layer. With the annex (minattn/fast/; the default off NumPy, ``plain(False)``
here) the arithmetic is regrouped and fused. Here both paths take one training step of every model of every
recipe from the same weights, batch and random stream, and a 20-step NDR run on CTL; ``tests/library/test_random_graphs.py``
does the same on random graphs. Each fused form and GPU kernel form is also held to its textbook form alone,
in training with dropout, training with dropout 0 and evaluation. And on the CPU the default path never steps
into the annex: what a debugger shows is the library as written.

Tolerances: the one-step comparison runs in float64; every gradient and every updated weight agrees to
1e-6 relative, per parameter, to the largest entry of that parameter (a parameter whose exact gradient is
0, a bias a softmax ignores, is held to 1e-12 of the model's largest gradient entry instead: its gradient
is rounding noise). The 20-step NDR run is float32, as trained; its losses agree to 1e-5.
"""
import contextlib
import os
import sys

import numpy as np
import pytest

import minattn
from minattn import backend, nn, optim
from minattn import functional as F
from minattn.engine import Tensor, eval_mode, faster, plain
from minattn.models.encoder import Classifier, EncoderConfig
from minattn.lab.recipes import RECIPES, recipe_for
from minattn.lab.recipes.base import optimizer
from minattn.lab.settings import make_config

CASES = [(recipe.tasks[0], model) for recipe in RECIPES for model in recipe.models]
SETTINGS = {"mlu": {"train_size": 1000}}    # as the golden runs: a smaller training set, quicker to make
_LOADED = {}                                 # task -> a recipe that has loaded it (sort and mlu take seconds)


def _recipe(task, model_name):
    cfg = make_config(task, model_name, "cpu", batch_size=4, seed=0, **SETTINGS.get(task, {}))
    recipe = recipe_for(task)(cfg)
    if task not in _LOADED:
        recipe.load_task()
        _LOADED[task] = recipe
    else:   # the task's data, loaded once for all its models (what load_task sets, the config aside)
        recipe.__dict__.update({k: v for k, v in vars(_LOADED[task]).items() if k != "cfg"})
    return recipe


def one_step(task, model_name, textbook):
    """(loss, {name: gradient}, {name: weight after the step}) of one training step at the cpu preset, in
    float64 (so that the comparison sees the algebra, not float32 rounding; the 20-step run below is float32)."""
    recipe = _recipe(task, model_name)
    cfg = recipe.cfg
    with plain(textbook):
        model = recipe.build_model().double()
        batch = next(recipe.batches(np.random.default_rng([cfg.seed, 1])))
        opt = optimizer(cfg, model.parameters())
        model.train()
        model.set_rng(backend.RNG(cfg.seed, "cpu").reseed(0))
        loss = recipe.loss(model, batch)[0]
        loss.backward()
        grads = {n: p.grad.copy() for n, p in model.named_parameters() if p.grad is not None}
        if cfg.grad_clip:
            optim.clip_grad_norm(model.parameters(), cfg.grad_clip)
        opt.step()
        return float(loss.data), grads, {n: p.data.copy() for n, p in model.named_parameters()}


def _close(name, a, b, scale, rtol):
    atol = max(rtol * float(np.abs(b).max(initial=0)), 1e-12 * scale)
    np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=name)


@pytest.mark.parametrize("task,model", CASES, ids=[f"{t}-{m}" for t, m in CASES])
def test_one_training_step_is_the_same_on_both_paths(task, model):
    loss_p, grads_p, weights_p = one_step(task, model, textbook=True)
    loss_f, grads_f, weights_f = one_step(task, model, textbook=False)
    assert loss_p == pytest.approx(loss_f, rel=1e-6)
    assert sorted(grads_p) == sorted(grads_f)
    scale = max(float(np.abs(g).max()) for g in grads_f.values())
    for name in grads_f:
        _close(f"gradient of {name}", grads_p[name], grads_f[name], scale, 1e-6)
    for name in weights_f:
        _close(f"updated {name}", weights_p[name], weights_f[name], 1.0, 1e-6)


def _losses(textbook):
    """20 NDR training steps on CTL, train.py's step written out: batch → loss → backward → clip → AdamW."""
    cfg = make_config("ctl", "ndr", "cpu", seed=0, batch_size=8)
    recipe = recipe_for("ctl")(cfg)
    recipe.load_task()
    losses, rng = [], backend.RNG(cfg.seed, "cpu")
    with plain(textbook):
        model = recipe.build_model()
        opt, stream = optimizer(cfg, model.parameters()), recipe.batches(np.random.default_rng([cfg.seed, 1]))
        for step in range(20):
            model.set_rng(rng.reseed(step))
            loss = recipe.loss(model, next(stream))[0]
            opt.zero_grad()
            loss.backward()
            optim.clip_grad_norm(model.parameters(), cfg.grad_clip)
            opt.step()
            losses.append(float(loss.data))
    return losses


def test_twenty_ndr_steps_on_ctl_give_the_same_losses():
    plain_losses, fast_losses = _losses(True), _losses(False)
    assert len(fast_losses) == 20
    np.testing.assert_allclose(plain_losses, fast_losses, rtol=1e-5)


ANNEX = os.path.join(os.path.dirname(os.path.abspath(minattn.__file__)), "fast") + os.sep


def ndr_step_entering(path):
    """One forward and backward of a small NDR classifier in float64 under ``plain(path)`` (None: the
    default, by device): the (file, function) pairs of minattn/fast/ it entered, traced with sys.setprofile
    as a debugger would step, with its loss and gradients."""
    model = Classifier("ndr", 5, 3, EncoderConfig(d_model=16, n_head=2, d_ff=32, n_steps=3)).double()
    model.set_rng(backend.RNG(0, "cpu"))
    entered = set()

    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(ANNEX):
            entered.add((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
    with plain(path):
        sys.setprofile(trace)
        try:
            logits = model(np.array([[6, 1, 2, 5], [6, 3, 5, 0]]), np.array([4, 3]))
            loss = F.cross_entropy(logits, np.array([0, 2]))
            loss.backward()
        finally:
            sys.setprofile(None)
    return entered, float(loss.data), {n: p.grad for n, p in model.named_parameters()}


def test_on_the_cpu_the_default_path_never_enters_the_annex():
    default, loss, grads = ndr_step_entering(None)
    assert not default, sorted(default)
    annex, annex_loss, annex_grads = ndr_step_entering(False)        # MINATTN_PLAIN=0's path
    files = {f for f, _ in annex}
    assert {"accumulate.py", "geometric.py", "shared_layer.py", "slices.py"} <= files, sorted(annex)
    assert loss == pytest.approx(annex_loss, rel=1e-12)
    for name, g in grads.items():
        np.testing.assert_allclose(g, annex_grads[name], rtol=1e-9, atol=1e-12 * np.abs(g).max(), err_msg=name)


# --- every fused form and kernel form against its plain definition, in every mode ------------------------

MODES = {"train, dropout": (0.3, True), "train, dropout 0": (0.0, True), "eval": (0.3, False)}


def _form_case(case, dropout, dtype):
    """fn(*tensors) and its inputs (host arrays or Modules) for one form: geometric attention's two
    equations, LayerNorm, and the copy-gate layer (NDR's, or the "+ gate" baselines' with tanh) applied
    twice as a shared layer, with padding and every dropout at ``dropout``."""
    from minattn.attention import geometric as G
    from minattn.models.encoder import CopyGateLayer
    B, H, T, d, r = 3, 2, 7, 40, np.random.default_rng(0)
    key_mask = np.arange(T)[None] < np.array([T, T - 2, 1])[:, None]
    right = np.arange(T)[None, :] > np.arange(T)[:, None]

    def normal(*shape):
        return r.standard_normal(shape).astype(dtype)
    if case == "directional logits":
        return lambda q, s, a: faster(G.directional_logits, q)(q, s, a[:1], a[1:2], a[2:], right), [
            normal(B, H, T, T), normal(B, H, T, 2), normal(3)]
    if case == "geometric weights":
        return lambda z: G.geometric_attention_weights(z, key_mask), [3 * normal(B, H, T, T)]
    if case == "layer norm":
        return lambda x, w, b: F.layer_norm(x, w, b), [normal(B, T, d), 1 + 0.1 * normal(d), normal(d)]
    cfg = EncoderConfig(d_model=d, n_head=H, d_ff=2 * d, dropout=dropout, gate_dropout=dropout / 2)
    weights = np.random.default_rng(1)
    layer = CopyGateLayer(G.GeometricAttention(d, H, dropout / 3, rng=weights), cfg, weights,
                          tanh_out=case == "gated layer (tanh)")
    layer.set_rng(backend.RNG(7, "cpu"))

    def twice(h, m):
        with m.repeated(2):
            return m(m(h, key_mask=key_mask), key_mask=key_mask)
    return twice, [normal(B, T, d), layer.to("cpu", dtype)]


def _form_run(case, mode, dtype):
    """The form's output and every input's (and parameter's) gradient, as host arrays."""
    dropout, training = MODES[mode]
    fn, inputs = _form_case(case, dropout, dtype)
    ins = [a if isinstance(a, nn.Module) else Tensor(a, requires_grad=True) for a in inputs]
    with (contextlib.nullcontext() if training else eval_mode()):
        y = fn(*ins)
    y.backward(np.random.default_rng(2).standard_normal(y.shape).astype(dtype))
    out = {"forward": y.data}
    for i, t in enumerate(ins):
        params = t.named_parameters() if isinstance(t, nn.Module) else [("", t)]
        out.update({f"grad {i}.{n}": p.grad for n, p in params})
    return out


FORMS = ["directional logits", "geometric weights", "layer norm", "NDR layer", "gated layer (tanh)"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", FORMS)
def test_every_fused_and_kernel_form_equals_its_plain_definition(case, mode, monkeypatch):
    """The textbook form against: the annex's fused and grouped forms (float64); the GPU tier's kernel
    forms running their NumPy definitions, as on the counting device (float64); and their launch code with
    the kernels' NumPy transcriptions (tests/library/test_gpu_kernels.py's emulations; float32)."""
    from minattn.fast import kernels
    from tests.library.test_gpu_kernels import emulate
    with plain(True):
        ref = _form_run(case, mode, np.float64)
    with plain(False):
        with kernels.switched(False):
            annex, annex32 = _form_run(case, mode, np.float64), _form_run(case, mode, np.float32)
        with kernels.switched(True), monkeypatch.context() as mp:
            mp.setitem(kernels._ONE_LAUNCH, "cpu", lambda what: contextlib.nullcontext())
            definitions = _form_run(case, mode, np.float64)
        emulate(monkeypatch)
        with kernels.switched(True):
            launched = _form_run(case, mode, np.float32)
    for path, got in ("annex", annex), ("kernel definitions", definitions), ("emulated kernels", launched):
        assert sorted(got) == sorted(ref), path
        for name, r in ref.items():
            # float32: as close as the annex's float32 run, or 1e-5 of the largest entry (a sum that
            # cancels, such as γ's gradient, is far smaller than its terms)
            scale = max(np.abs(r).max(), 1e-3)
            tol = 1e-9 if got is not launched else max(1e-5, 10 * np.abs(annex32[name] - r).max() / scale)
            np.testing.assert_allclose(got[name], r, rtol=0, atol=tol * scale,
                                       err_msg=f"{path}: {name}")


def test_a_graph_built_on_the_annex_backpropagates_on_numpy_outside_its_block():
    """On NumPy the annex hands the engine no deferred gradient (as off NumPy it does), so a graph built
    under plain(False) and backpropagated after it is the same graph: here a tensor cut into two slices."""
    x = Tensor(np.ones((2, 6)), requires_grad=True)
    with plain(False):
        y = (x[:, :3] * 2).sum() + x[:, 3:].sum()
    y.backward()
    np.testing.assert_array_equal(x.grad, [[2, 2, 2, 1, 1, 1]] * 2)
