"""Pictures of what a trained model does: attention maps, gates, value scores, relation matrices.

Two halves. *Collectors* (``*_pictures``, one per kind of model, each naming the papers' figures it
draws) run one example through a model (evaluation behaviour, no graph) and return ``Picture``
objects of host arrays, with one ``backend.to_numpy`` per picture (plus one for a prediction shown
in a title), so they run unchanged on a GPU; ``learning_curves`` draws runs' metrics logs
(minattn/lab/report.py). The *renderer* draws a Picture as a PNG with matplotlib (``save_png``;
``write_pictures`` saves a list), imported only there: an optional extra (``pip install -e
'.[plot]'``) that training never needs; without it ``--plot`` says so in one line
(``require_matplotlib``). ``train.py --plot`` runs each recipe's ``plot_examples`` on a checkpoint
and adds the run's learning curves:

    pictures = viz.encoder_pictures(model, ids, lengths, tokens, "ctl / ndr: 101 d a b", "ex", classes)
    viz.write_pictures(pictures, "runs/ctl-ndr-cpu-s0/plots")
"""
import contextlib
import io
import math
import os
import textwrap
from dataclasses import dataclass, field

import numpy as np

from minattn import backend
from minattn.attention.coda import CoDAttention
from minattn.attention.compositional import CompositionalAttention
from minattn.engine import Tensor, eval_mode, no_grad
from minattn.models import compositional as compositional_models

from .errors import UsageError
from .rundir import write_atomic

DPI = 100
CELL = 0.25          # inches per heatmap cell (half that for maps over 32 tokens)


@dataclass
class Panel:
    """One plot of a picture: a heatmap (2-D ``values``), bars (1-D, one label each in ``rows``), a
    histogram (any shape, flattened) or curves (2-D: a line per row against ``cols``, the x values, NaN
    where a row has no point; ``marks``: each row's marked x, or None). ``vmin``/``vmax`` fix the colour
    range, a histogram's or the curves' y range (None: from the data)."""
    values: np.ndarray
    title: str
    kind: str = "heatmap"
    rows: list = field(default_factory=list)   # heatmap: row labels (queries, steps); bars: bar labels
    cols: list = field(default_factory=list)   # heatmap: column labels (keys, input tokens)
    vmin: float = None
    vmax: float = None
    clabel: str = ""                           # heatmap: what the colour scale means
    xlabel: str = ""
    ylabel: str = ""
    marks: list = field(default_factory=list)  # curves: the marked x of each row (its selected step), or None


@dataclass
class Picture:
    """A titled grid of panels, saved as ``name``.png."""
    name: str
    title: str
    panels: list
    ncols: int = 0       # panels per row; 0: about a square grid

    def grid(self):
        ncols = self.ncols or math.ceil(math.sqrt(len(self.panels)))
        return math.ceil(len(self.panels) / ncols), ncols


# --- Collectors: model + one example → pictures (host arrays) -------------------------------------

@contextlib.contextmanager
def _inference(model):
    """Evaluation behaviour (no dropout or gate dropout, argmax attention) without recording a graph.
    The model's train/eval flag is restored afterwards: plotting must not change a model's state."""
    was_training = model.training
    model.eval()
    try:
        with no_grad(), eval_mode():
            yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _recording(modules):
    """Attention modules keep ``last_weights`` while ``record`` is on (see nn.Module.record)."""
    for m in modules:
        m.record = True
    try:
        yield
    finally:
        for m in modules:
            m.record = False


@contextlib.contextmanager
def after_each_call(module, hook):
    """Call ``hook(*args)`` after every call of this module instance. For what a model neither returns nor
    keeps per call (seq2attn's τ; CoDA's gate in a layer applied at every step), the instance's
    forward is wrapped for the duration and restored on exit: the model's code stays untouched."""
    forward = module.forward

    def wrapped(*args, **kwargs):
        out = forward(*args, **kwargs)
        hook(*args)
        return out
    module.forward = wrapped
    try:
        yield
    finally:
        del module.forward            # the class's method again


def step_tau(attention, query):
    """seq2attn's temperature τ_t of one decoding step as a (B,) device array. At inference the attention
    is an argmax and never computes τ, so it is computed here (``attention.tau`` gives a float ("fixed"),
    a (1,) ("latent") or a (B, 1) tensor ("conditioned"))."""
    tau, xp, B = attention.tau(query), backend.array_module(query.data), query.shape[0]
    if isinstance(tau, Tensor):
        return xp.broadcast_to(tau.data.reshape(-1), (B,))
    return xp.full((B,), tau, query.dtype)


def _check_tokens(tokens, n, what):
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} token labels for {n} {what}")


def _map(values, title, rows, cols, vmin=0.0, vmax=1.0):
    """An attention map: queries are rows, keys are columns."""
    return Panel(values, title, rows=rows, cols=cols, vmin=vmin, vmax=vmax, xlabel="key", ylabel="query")


# colour range of σ_rel(R) by activation; "linear" is unbounded (None: each panel symmetric about 0)
_RELATION_RANGE = {"softmax": (0, 1), "sigmoid": (0, 1), "tanh": (-1, 1), "linear": (None, None)}


def _layer_grid(maps, rows, cols, unit, vmin=0.0, vmax=1.0):
    """Panels for maps (L, H, T, S): a row of panels per layer, one panel per head (or relation). With
    vmin = vmax = None (unbounded relations) each panel's scale is symmetric about 0: the sign matters."""
    def bounds(m):
        top = float(np.abs(m).max()) or 1.0
        return (vmin, vmax) if vmin is not None else (-top, top)
    return [_map(m, f"layer {i + 1}, {unit} {h}", rows, cols, *bounds(m))
            for i, heads in enumerate(maps) for h, m in enumerate(heads)]


def _coda_picture(attn, M, g, tokens, title, name):
    """tanh(E), the gate and M of every head (a row each), then their histograms over all heads, for one
    call of a CoDAttention: M = F_X(E) ⊙ gate(N) (attention/coda.py), each in its colour range. M and g are
    device arrays (H, T, S): one transfer brings both to the host."""
    M, g = backend.to_numpy(backend.array_module(M).stack([M, g]))
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(g != 0, M / g, np.nan)   # F_X(E) = M / gate: exact wherever the gate did not underflow
    fx, fn = attn.composition.split("-")
    gate = {"scaled": f"2·{fn}(N)" if fn == "sigmoid" else f"{fn}(N)",
            "centered": f"{fn}(N − mean N)"}[attn.gate]
    factors = [((f"{fx}(E)", (-1, 1) if fx == "tanh" else (0, 1)), e),
               ((gate, (0, 1) if fn == "sigmoid" else (-1, 1)), g), (("M", (-1, 1)), M)]
    panels = [_map(v[h], f"head {h}: {label}", tokens, tokens, lo, hi)
              for h in range(M.shape[0]) for (label, (lo, hi)), v in factors]
    panels += [Panel(v, f"{label}, all heads", kind="hist", vmin=lo, vmax=hi, xlabel=label, ylabel="count")
               for (label, (lo, hi)), v in factors]
    return Picture(name, title, panels, ncols=3)


def encoder_pictures(model, ids, lengths, tokens, title, name, classes):
    """One sequence through a ``Classifier`` (models/encoder.py): for the gated models (NDR and the
    "+ gate" baselines) the mean copy gate of every column at every step (NDR paper Fig. 2: which columns
    update at which step); for every model one picture per head with its attention map at every step
    (Fig. 3: who reads whom). ids (1, T) and lengths (1,) on the model's device; ``tokens`` labels the
    T positions ([SOS, x…, EOS]); ``classes`` names the predicted class in the titles."""
    _check_tokens(tokens, ids.shape[1], "positions")
    attn, trace, coda_calls = model.encoder.layer.attn, [], []
    coda = isinstance(attn, CoDAttention)
    # CoDA keeps its gate of the last call only: take it after every step
    hook = after_each_call(attn, lambda *_: coda_calls.append((attn.last_weights, attn.last_gate))) if coda \
        else contextlib.nullcontext()
    with _inference(model), hook:
        logits = model(ids[:1], lengths[:1], trace=trace)
    title += f" → predicted {classes[int(backend.to_numpy(logits.data.argmax(-1))[0])]}"
    xp = backend.array_module(ids)
    steps = [f"step {k + 1}" for k in range(len(trace))]
    pictures = []
    if trace[0][1] is not None:   # a copy gate per column and channel: its mean says "this column updates"
        gates = backend.to_numpy(xp.stack([g.data[0].mean(axis=-1) for _, g in trace]))   # (steps, T)
        pictures.append(Picture(f"{name}-gates", f"{title}\ncopy-gate activity", [
            Panel(gates, "mean gate per column", rows=steps, cols=tokens, vmin=0, vmax=1, xlabel="column",
                  ylabel="step", clabel="1: the column takes its update, 0: it is copied unchanged")]))
    # compositional attention as the encoder's attention: its "heads" are searches
    unit = "search" if isinstance(attn, CompositionalAttention) else "head"
    lo = -1 if coda else 0            # CoDA's quasi-attention M lies in (−1, 1)
    for h in range(trace[0][0].shape[1]):
        maps = backend.to_numpy(xp.stack([A.data[0, h] for A, _ in trace]))                  # (steps, T, T)
        pictures.append(Picture(f"{name}-attention-{unit}{h:02d}", f"{title}\nattention of {unit} {h}", [
            _map(m, f"step {k + 1}, {unit} {h}", tokens, tokens, lo) for k, m in enumerate(maps)]))
    pictures += [_coda_picture(attn, M.data[0], g.data[0], tokens, f"{title}\nCoDA at step {k + 1}",
                               f"{name}-coda-step{k + 1:02d}") for k, (M, g) in enumerate(coda_calls)]
    return pictures


def retrieval_pictures(model, x, prefs, title, name="retrieval"):
    """The Contextual Retrieval Task (models/compositional.py) on a batch x (B, N, in_dim) with the task's
    retrieval choices prefs (B, N, S_gt) (host): the search maps of the first sample (which object each search
    finds), and for the compositional models the value scores over all samples: the mean retrieval choice
    of each search (Compositional Attention Fig. 4) and per ground-truth retrieval (Fig. 5: a model that
    learned the task gives each (search, retrieval) of the task its own (search, retrieval))."""
    with _inference(model):
        _, A, c = model(x, return_weights=True)
    B, S, N, _ = A.shape
    prefs = np.asarray(prefs)
    objects = [f"o{i}" for i in range(N)]
    choices = [f"o{i} r*={','.join(map(str, prefs[0, i]))}" for i in range(N)]
    unit = "head" if c is None else "search"
    maps = backend.to_numpy(A.data[0])                                                          # (S, N, N)
    pictures = [Picture(f"{name}-search-maps", f"{title}\nsearch maps of sample 0 (the diagonal is masked)", [
        Panel(maps[s], f"{unit} {s}", rows=choices, cols=objects, vmin=0, vmax=1, xlabel="found object",
              ylabel="object (its retrieval choices)") for s in range(S)])]
    if c is None:
        return pictures
    scores = backend.to_numpy(c.data)                                                           # (B, N, S, R)
    R = scores.shape[-1]
    per_search = scores.reshape(-1, S, R).mean(axis=0)
    M = compositional_models.specialisation(scores, prefs, model.cfg.retrievals)        # (S_gt, R_gt, S, R)
    S_gt, R_gt = M.shape[:2]
    pictures.append(Picture(f"{name}-value-scores-per-search", f"{title}\nmean value scores on {B} samples", [
        Panel(per_search, "mean retrieval choice per search", rows=[f"search {s}" for s in range(S)],
              cols=[f"retrieval {r}" for r in range(R)], vmin=0, vmax=1, xlabel="retrieval",
              ylabel="search")]))
    pictures.append(Picture(f"{name}-value-scores-per-ground-truth",
                            f"{title}\nmean value scores per ground-truth retrieval ({B} samples)", [
        Panel(M.reshape(S_gt * R_gt, S * R), "mean value score",
              rows=[f"task search {g}, retrieval {r}" for g in range(S_gt) for r in range(R_gt)],
              cols=[f"s{s} r{r}" for s in range(S) for r in range(R)], vmin=0, vmax=1,
              xlabel="model search s, retrieval r", ylabel="ground truth")]))
    return pictures


def seq2attn_pictures(model, src, src_lengths, max_len, in_tokens, out_vocab, title, name="example"):
    """Greedy decoding of one sequence by a ``Seq2Attn`` (models/seq2attn.py): the attention trace (output
    step × input token; one-hot for seq2attn at inference, soft for the baseline), with rows labelled by
    the predicted tokens up to <eos>, and — with Gumbel attention — the temperature τ of every step.
    src (1, n) ids, src_lengths (1,); ``in_tokens`` labels the inputs, ``out_vocab`` the output ids."""
    _check_tokens(in_tokens, src.shape[1], "inputs")
    attention, taus = model.attention, []
    gumbel = attention.activation != "softmax"
    record_tau = after_each_call(attention, lambda query, *_: taus.append(step_tau(attention, query)))
    with _inference(model), (record_tau if gumbel else contextlib.nullcontext()):
        ids, weights = model.greedy(src[:1], src_lengths[:1], max_len, return_attention=True)
    xp = backend.array_module(src)
    out = [out_vocab[i] for i in backend.to_numpy(ids[0])]
    steps = out.index("<eos>") + 1 if "<eos>" in out else len(out)       # nothing after <eos> is read
    columns = [weights[0]] + ([xp.concatenate(taus)[:, None].astype(weights.dtype)] if gumbel else [])
    data = backend.to_numpy(xp.concatenate(columns, axis=1))[:steps]     # attention and τ in one transfer
    rows = [f"{t + 1} {tok}" for t, tok in enumerate(out[:steps])]
    panels = [Panel(data[:, :len(in_tokens)], "attention (output step × input)", rows=rows, cols=in_tokens,
                    vmin=0, vmax=1, xlabel="input token", ylabel="output step")]
    if gumbel:
        panels.append(Panel(data[:, -1], f"temperature τ per step ({model.attention.temperature})",
                            kind="bars", rows=rows, xlabel="τ"))
    return [Picture(f"{name}-attention", f"{title}\n→ {' '.join(out[:steps])}", panels, ncols=len(panels))]


def seq2seq_pictures(model, src, n_steps, start, tokens, title, name="example", out_vocab=None):
    """Greedy decoding of one sequence by an encoder–decoder of models/seq2seq.py or abstractor.py
    (sorting; MLU): the encoder's self-attention of every layer and head — with CoDA, also tanh(E), the
    gate and M of each layer, and their histograms — and for an Abstractor its relation matrices and its
    symbols' attention (``_abstractor_pictures``). src (1, T, d) vectors or (1, T) ids on the model's
    device; ``tokens`` labels the T inputs; ``out_vocab`` names output ids in the title (default: the ids)."""
    _check_tokens(tokens, src.shape[1], "inputs")
    abstractors = getattr(model, "abstractors", [])
    encoder = [layer.attn for layer in model.encoder]
    watched = encoder + [m for a in abstractors for layer in a.layers for m in (layer.rca, layer.self_attn)
               if m is not None]
    with _inference(model), _recording(watched):
        pred, _ = model.greedy(src[:1], n_steps, start)
    out = [str(i) if out_vocab is None else out_vocab[i] for i in backend.to_numpy(pred[0])]
    title += f" → predicted {' '.join(out[:out.index('<eos>') + 1] if '<eos>' in out else out)}"
    pictures = []
    if encoder:
        coda = isinstance(encoder[0], CoDAttention)
        pictures.append(Picture(f"{name}-encoder-attention", f"{title}\nencoder self-attention", _layer_grid(
            _stacked(encoder), tokens, tokens, "head", -1 if coda else 0), ncols=model.cfg.n_head))
        pictures += [_coda_picture(m, m.last_weights.data[0], m.last_gate.data[0], tokens,
                                   f"{title}\nCoDA in encoder layer {i + 1}", f"{name}-coda-layer{i + 1}")
                     for i, m in enumerate(encoder) if coda]
    for k, a in enumerate(abstractors):
        # the second Abstractor of architecture (e) relates the first one's abstract states, not objects
        objects = tokens if k == 0 else [f"a{k}[{i}]" for i in range(len(tokens))]
        pictures += _abstractor_pictures(a, objects, f"{title}\nAbstractor {k}", f"{name}-abstractor{k}")
    return pictures


def _stacked(modules):
    """The recorded weights of the first sample of every module, on the host: (L, H, T, S)."""
    w = [m.last_weights.data[0] for m in modules]
    return backend.to_numpy(backend.array_module(w[0]).stack(w))


def _abstractor_pictures(abstractor, objects, title, name):
    """An Abstractor's relation matrices σ_rel(R) of every layer and head (which objects it relates: RCA
    compares objects, its values are symbols) — or, for the ablation, the symbols' cross-attention to the
    objects — and the symbols' self-attention, from the weights its layers recorded."""
    layers, n_head = abstractor.layers, abstractor.cfg.n_head
    symbols = [f"s{i}" for i in range(len(objects))]
    if layers[0].ablation:  # standard cross-attention: symbols (queries) read objects (keys)
        panels = _layer_grid(_stacked([layer.rca for layer in layers]), symbols, objects, "head")
        what = "symbols' cross-attention to the objects (ablation)"
    else:
        act = layers[0].rca.activation
        panels = _layer_grid(_stacked([layer.rca for layer in layers]), objects, objects, "head",
                             *_RELATION_RANGE[act])
        what = f"relation matrices {act}(R)"
    pictures = [Picture(f"{name}-relations", f"{title}: {what}", panels, ncols=n_head)]
    if layers[0].self_attn is not None:
        pictures.append(Picture(f"{name}-symbol-attention", f"{title}: symbols' self-attention", _layer_grid(
            _stacked([layer.self_attn for layer in layers]), symbols, symbols, "head"), ncols=n_head))
    return pictures


def relational_pictures(model, x, tokens, title, name, classes):
    """One sample through a ``RelationalClassifier`` (models/abstractor.py; pairwise order, SET): the
    relation matrices σ_rel(R^r) of every layer and relation r (which pairs of objects it relates, and
    how). x (1, m, d_in) on the model's device; ``tokens`` labels the m objects; ``classes`` names the
    outputs (one logit: classes[logit > 0]; several: classes[argmax])."""
    _check_tokens(tokens, x.shape[1], "objects")
    rcas = [layer.rca for layer in model.layers]
    with _inference(model), _recording(rcas):
        logits = model(x[:1])
    z = logits.data[0]                                                     # (n_out,)
    pick = (z > 0).astype(np.int64)[0] if z.shape[0] == 1 else z.argmax()
    title += f" → predicted {classes[int(backend.to_numpy(pick))]}"
    act = rcas[0].activation
    panels = _layer_grid(_stacked(rcas), tokens, tokens, "relation", *_RELATION_RANGE[act])   # (L, d_r) maps
    return [Picture(f"{name}-relations", f"{title}\nrelation matrices {act}(R)", panels,
                    ncols=rcas[0].n_relations)]


# --- Learning curves: runs' metrics logs → one picture --------------------------------------------

NOT_CURVES = ("step", "wall_s")      # logged with every evaluation, but not something the model learned


def learning_curves(runs, title, name="learning-curves"):
    """The learning curves of one run or several side by side: a panel per number the logs hold (the
    training loss and every metric, in the log's order), a line per run against the step, and each run's
    selected step marked. ``runs``: (label, log, selected step or None) triples, the log being the entries
    of DIR/metrics.jsonl (dicts with "step"); an entry without a number (a diverged evaluation) is a gap."""
    keys = list(dict.fromkeys(k for _, log, _ in runs for e in log for k in e if k not in NOT_CURVES))
    steps = sorted({e["step"] for _, log, _ in runs for e in log})
    column = {step: i for i, step in enumerate(steps)}
    panels = []
    for key in keys:
        values = np.full((len(runs), len(steps)), np.nan)
        for row, (_, log, _) in enumerate(runs):
            for e in log:
                v = e.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    values[row, column[e["step"]]] = v
        finite = values[np.isfinite(values)]
        # a fraction (an accuracy) on the whole 0..1 scale, so runs and splits compare at a glance
        fraction = "loss" not in key and finite.size and finite.min() >= 0 and finite.max() <= 1
        panels.append(Panel(values, key, kind="curves", rows=[label for label, _, _ in runs], cols=steps,
                            marks=[selected for _, _, selected in runs], vmin=0 if fraction else None,
                            vmax=1 if fraction else None, xlabel="step"))
    return Picture(name, title, panels, ncols=min(4, len(panels)))


# --- The renderer ---------------------------------------------------------------------------------

def _quarter(inches):
    """Rounded up to a quarter inch: at 100 DPI a whole number of pixels, exact in binary, so the PNG's size
    is figure_inches · DPI without rounding for matplotlib and us to disagree about."""
    return math.ceil(inches * 4) / 4


def _panel_inches(panel):
    """(width, height) of a panel in inches: room for its cells, tick labels, title and colour bar."""
    if panel.kind == "heatmap":
        rows, cols = panel.values.shape
        cell = CELL if max(rows, cols) <= 32 else CELL / 2
        return _quarter(2.5 + cell * cols), _quarter(1.75 + cell * rows)
    if panel.kind == "bars":
        return 3.0, 1.75 + CELL * len(panel.values)      # as tall as a heatmap with a row per bar
    return 4.0, 3.0                                      # a histogram or curves


def _title_lines(picture, width_inches):
    return [line for part in picture.title.split("\n")
            for line in textwrap.wrap(part, int(width_inches * 11)) or [""]]


def figure_inches(picture):
    """The picture's size in inches: a uniform grid of its largest panel, plus its wrapped title."""
    nrows, ncols = picture.grid()
    sizes = [_panel_inches(p) for p in picture.panels]
    width = ncols * max(w for w, _ in sizes)
    return width, nrows * max(h for _, h in sizes) + 0.25 * (len(_title_lines(picture, width)) + 1)


def _draw_heatmap(fig, ax, panel):
    """The colour scale is the panel's bounds, else the data's; signed data gets a scale symmetric
    about 0, so that 0 is the neutral colour."""
    lo, hi = panel.vmin, panel.vmax
    if lo is None or hi is None:
        finite = panel.values[np.isfinite(panel.values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        lo, hi = (-max(-lo, hi), max(-lo, hi)) if lo < 0 else (lo, hi if hi > lo else lo + 1)
    im = ax.imshow(panel.values, cmap="RdBu_r" if lo < 0 else "viridis", vmin=lo, vmax=hi, aspect="auto",
                   interpolation="nearest")
    small = max(panel.values.shape) > 32
    ax.set_xticks(range(len(panel.cols)), panel.cols, rotation=90, fontsize=5 if small else 7)
    ax.set_yticks(range(len(panel.rows)), panel.rows, fontsize=5 if small else 7)
    fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02).set_label(panel.clabel, fontsize=6)


def _draw_curves(ax, panel):
    """A line per row, its marked step as a dashed vertical line and a dot; a legend when there are rows to
    tell apart (the picture's title says what the mark is)."""
    steps = np.asarray(panel.cols, dtype=float)
    marks = panel.marks or [None] * len(panel.rows)
    for label, ys, mark in zip(panel.rows, panel.values, marks):
        ok = np.isfinite(ys)
        line, = ax.plot(steps[ok], ys[ok], lw=1.2, marker="." if ok.sum() < 30 else None,
                        label=label if len(panel.rows) > 1 else None)
        if mark in panel.cols:
            y = ys[panel.cols.index(mark)]
            ax.axvline(mark, color=line.get_color(), ls="--", lw=0.8)
            if np.isfinite(y):
                ax.plot([mark], [y], "o", color=line.get_color(), ms=4)
    if panel.vmin is not None and panel.vmax is not None:
        pad = 0.03 * (panel.vmax - panel.vmin)
        ax.set_ylim(panel.vmin - pad, panel.vmax + pad)
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)


def save_png(picture, path):
    """Draw the picture with matplotlib (its object API: no pyplot, no GUI backend, safe headless) and
    write it to ``path``. Raises ImportError without matplotlib."""
    from matplotlib.figure import Figure   # lazy: matplotlib is an optional extra

    fig = Figure(figsize=figure_inches(picture), dpi=DPI, layout="constrained")
    nrows, ncols = picture.grid()
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, panel in zip(axes, picture.panels):
        if panel.kind == "heatmap":
            _draw_heatmap(fig, ax, panel)
        elif panel.kind == "bars":
            ax.barh(range(len(panel.values)), panel.values, color="tab:blue")
            ax.set_yticks(range(len(panel.rows)), panel.rows, fontsize=7)
            ax.invert_yaxis()      # the first step on top, as in the heatmap beside it
        elif panel.kind == "curves":
            _draw_curves(ax, panel)
        else:                      # a histogram of the finite values, in the panel's range if it has one
            known = panel.vmin is not None and panel.vmax is not None
            ax.hist(panel.values[np.isfinite(panel.values)], 30, (panel.vmin, panel.vmax) if known else None,
                    color="tab:blue")
        ax.set_title(panel.title, fontsize=8)
        ax.set_xlabel(panel.xlabel, fontsize=7)
        ax.set_ylabel(panel.ylabel, fontsize=7)
    for ax in axes[len(picture.panels):]:
        ax.set_visible(False)
    fig.suptitle("\n".join(_title_lines(picture, figure_inches(picture)[0])), fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png")
    # a new file renamed over the old: never written through a link, nor into a hard-linked copy's original
    write_atomic(path, lambda f: f.write(buf.getvalue()), mode="wb")
    return path


def require_matplotlib(flag):
    """A UsageError, one line, unless matplotlib can be imported: the pictures are PNGs it draws."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise UsageError(f"{flag} draws PNGs with matplotlib, which is not installed: pip install matplotlib "
                         "(or pip install -e '.[plot]')") from None


def write_pictures(pictures, out_dir):
    """Save every picture as ``out_dir/NAME.png`` and return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    return [save_png(p, os.path.join(out_dir, p.name + ".png")) for p in pictures]
