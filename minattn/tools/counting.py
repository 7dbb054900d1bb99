"""A test device that counts what a GPU would be asked to do: kernel launches and host syncs.

On a GPU every CuPy call costs host time whatever its size, so a small model's step time is its
number of launches. ``CountingArray`` is the strict device's array (minattn/tools/strict.py, which
states CuPy's rules) with ``COUNTER`` as its hook, tallying per phase of a training step.
``python -m minattn.tools.counting`` prints launches per training step of each model family and the
autograd nodes its forward records (``make bench`` runs it); ``--kernels`` turns the GPU tier on (a
kernel counts one launch); ``--detail FAMILY`` says where the launches come from.
"""
import collections
import contextlib
import os
import sys
import traceback

import numpy as np

from minattn import backend, optim
from minattn import functional as F
from minattn.engine import topological_order
from minattn.fast import kernels
from minattn.tools import strict
from minattn.tools.bench import PHASES, train_step


class Counter:
    """Launches and syncs per phase; ``sites`` (when ``detail``) attributes launches to source
    lines."""

    def __init__(self):
        self.reset()
        self.detail = False

    def reset(self):
        self.phase = "other"
        self.nodes = collections.Counter()   # count_step: the autograd nodes of the forward, by op
        self.launches = collections.Counter()
        self.syncs = collections.Counter()
        self.sites = collections.Counter()

    def launch(self, n=1, what=""):
        self.launches[self.phase] += n
        if self.detail:
            self.sites[(self.phase, _site(), what)] += n

    def sync(self, what):
        self.syncs[self.phase] += 1
        if self.detail:
            self.sites[(self.phase, _site(), "SYNC " + what)] += 1


COUNTER = Counter()
_SKIP = {os.path.abspath(__file__), os.path.abspath(strict.__file__)}   # the device's own frames


def _site():
    """file:line of the innermost minattn (or caller) frame that is not the device's own."""
    for fr in reversed(traceback.extract_stack(limit=16)[:-2]):
        if os.path.abspath(fr.filename) not in _SKIP and "numpy" not in fr.filename:
            return f"{os.path.basename(fr.filename)}:{fr.lineno} {fr.name}"
    return "?"


@contextlib.contextmanager
def phase(name):
    old, COUNTER.phase = COUNTER.phase, name
    try:
        yield
    finally:
        COUNTER.phase = old


class CountingArray(strict.StrictArray):
    __slots__ = ()
    counter = COUNTER


backend.register_device("counting", strict.Module(CountingArray), CountingArray)


@contextlib.contextmanager
def one_launch(what):
    """A GPU kernel's NumPy definition (minattn/fast/kernels.py), counted as the one launch it is on
    CuPy."""
    launches, sites = COUNTER.launches.copy(), COUNTER.sites.copy()
    try:
        yield
    finally:
        COUNTER.launches, COUNTER.sites = launches, sites
        COUNTER.launch(1, "kernel " + what)


kernels.count_as_one_launch("counting", one_launch)   # used where the kernels are on (--kernels)


# --- one training step of each model family, counted per phase -----------------------------------

def count_step(model, loss_fn, opt, clip=None, rng=None, steps=2):
    """Run ``steps`` training steps on the counting device as train.py does (bench.train_step) and
    return the counts of the last one: ({phase: launches}, {phase: syncs}); its forward's autograd
    nodes by op are left in ``COUNTER.nodes``. The first step is a warm-up (optimizer state and
    per-shape caches are made once per run, not per step)."""
    def forward():
        loss = loss_fn()
        COUNTER.nodes.update(type(t.creator).__name__ for t in topological_order(loss)
                             if t.creator is not None)
        return loss
    step = train_step(model, opt, forward, rng, clip, phase)
    for _ in range(steps):
        COUNTER.reset()
        step()
    return dict(COUNTER.launches), dict(COUNTER.syncs)


def ndr_ctl_step(model_name="ndr", device="counting"):
    """(model, loss_fn, opt, clip, rng) for one CTL training step as train.py's cpu preset has it: its
    config, model, optimizer and first batch (the launch count does not depend on its size)."""
    from minattn.lab.recipes import recipe_for
    from minattn.lab.recipes.base import optimizer
    from minattn.lab.settings import make_config
    cfg = make_config("ctl", model_name, "cpu")
    recipe = recipe_for("ctl")(cfg)
    recipe.load_task()
    model = recipe.build_model().to(device)
    batch = next(recipe.batches(np.random.default_rng([cfg.seed, 1])))
    x, lengths, y = (backend.to_device(np.asarray(a), device) for a in batch)
    opt = optimizer(cfg, model.parameters())
    return model, lambda: F.cross_entropy(model(x, lengths), y), opt, cfg.grad_clip, backend.RNG(0, device)


def families(device="counting"):
    """(label, builder) for the model families of ``make bench``, built on ``device``."""
    def up(a):
        return backend.to_device(np.asarray(a), device)

    def crt(name):
        from minattn.models.compositional import CRTConfig, CRTModel
        r = np.random.default_rng(0)
        x, y = (up(r.standard_normal(shape).astype(np.float32))
                for shape in ((256, 10, 14), (256, 10)))
        model = CRTModel(name, 14, CRTConfig(searches=2, retrievals=4)).to(device)
        opt = optim.AdamW(model.parameters(), 1e-4, weight_decay=0.0)
        return model, lambda: F.abs(model(x) - y).mean(), opt, None, None

    def seq2attn():
        from minattn.models.seq2attn import Seq2Attn, model_config
        r = np.random.default_rng(0)
        model = Seq2Attn(model_config("seq2attn"), 19, 12, sos_id=2).to(device)
        src, tgt = up(r.integers(2, 19, (64, 4))), up(r.integers(4, 12, (64, 4)))
        lengths = up(np.full(64, 4))
        opt = optim.AdamW(model.parameters(), 1e-3, weight_decay=0.0)
        return model, lambda: model.loss(src, lengths, tgt, lengths), opt, 5.0, backend.RNG(0, device)

    def abstractor(name):
        from minattn.models.abstractor import AbstractorConfig, build_seq2seq
        r = np.random.default_rng(0)
        B, T = 512, 10
        y = r.permuted(np.tile(np.arange(T), (B, 1)), axis=1)
        x = up(r.standard_normal((B, T, 12)).astype(np.float32))
        tgt_in = up(np.concatenate([np.full((B, 1), 10), y[:, :-1]], axis=1))
        layers = {} if name == "abstractor" else dict(n_encoder_layers=4, n_decoder_layers=4)
        model = build_seq2seq(name, 11, 10, AbstractorConfig(**layers), d_src=12).to(device)
        yd, opt = up(y), optim.AdamW(model.parameters(), 1e-3, weight_decay=0.0)
        return model, lambda: F.cross_entropy(model(x, tgt_in), yd), opt, None, backend.RNG(0, device)

    return [("ndr (CTL, cpu preset)", lambda: ndr_ctl_step("ndr", device)),
            ("transformer (CTL, cpu preset)", lambda: ndr_ctl_step("transformer", device)),
            ("transformer-rel-gate (CTL)", lambda: ndr_ctl_step("transformer-rel-gate", device)),
            ("transformer-coda (CTL)", lambda: ndr_ctl_step("transformer-coda", device)),
            ("crt mha", lambda: crt("mha")), ("crt compositional", lambda: crt("compositional")),
            ("seq2attn (batch 64)", seq2attn),
            ("abstractor", lambda: abstractor("abstractor")),
            ("transformer-seq2seq", lambda: abstractor("transformer-seq2seq"))]


def table(only=None):
    """Rows of launches per training step by phase, and syncs, for each family."""
    print("launches per training step on the counting device (minattn/tools/counting.py), and the "
          "autograd")
    print("nodes its forward records (the engine's Python work per step; backward visits each once "
          "more)")
    print(f"        {'model':32s} {'forward':>8s} {'backward':>9s} {'clipping':>9s} "
          f"{'optimizer':>10s} {'total':>7s} {'syncs':>6s} {'nodes':>6s}")
    for label, build in families():
        if only and only not in label:
            continue
        model, loss_fn, opt, clip, rng = build()
        launches, syncs = count_step(model, loss_fn, opt, clip, rng)
        cells = " ".join(f"{launches.get(p, 0):{w}d}" for p, w in zip(PHASES, (8, 9, 9, 10)))
        print(f"        {label:32s} {cells} {sum(launches.values()):7d} {sum(syncs.values()):6d} "
              f"{sum(COUNTER.nodes.values()):6d}")


if __name__ == "__main__":
    if "--kernels" in sys.argv:
        sys.argv.remove("--kernels")
        kernels.switch(True)
    if len(sys.argv) > 1 and sys.argv[1] == "--detail":
        COUNTER.detail = True
        build = dict(families())[sys.argv[2]] if len(sys.argv) > 2 else ndr_ctl_step
        model, loss_fn, opt, clip, rng = build()
        count_step(model, loss_fn, opt, clip, rng)
        top = sorted(COUNTER.sites.items(), key=lambda kv: -kv[1])[:int(os.environ.get("TOP", 60))]
        for (ph, site, what), n in top:
            print(f"{n:6d}  {ph:9s} {site:50s} {what}")
        print(dict(COUNTER.launches), dict(COUNTER.syncs))
        print("forward nodes:", sum(COUNTER.nodes.values()), dict(COUNTER.nodes.most_common()))
    else:
        table(sys.argv[1] if len(sys.argv) > 1 else None)
