"""Pictures (minattn/lab/viz.py and train.py --plot): what the collectors take from each model, PNGs of the
expected size (skipped without matplotlib), one line and exit 2 for --plot when matplotlib is missing (training
never needs it), and the command's errors. Every model here is tiny: the file runs in seconds."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from minattn import backend
from minattn.lab import viz
from minattn.models import abstractor, compositional, seq2attn
from minattn.models.encoder import Classifier, EncoderConfig
from minattn.models.seq2seq import CoDASeq2SeqTransformer, EncoderDecoderConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import tasks  # noqa: E402
import train  # noqa: E402
from minattn.lab import recipes, report  # noqa: E402
from minattn.lab.recipes.base import example_name  # noqa: E402
from minattn.lab.rundir import read_log  # noqa: E402

TOKENS = ["<sos>", "a", "b", "c", "<eos>"]
OUT_VOCAB = ["<unk>", "<pad>", "<sos>", "<eos>", "A", "B", "C"]


def on(device, *arrays):
    return [backend.to_device(np.asarray(a), device) for a in arrays]


def encoder(name, device, n_head=2, n_steps=3):
    cfg = EncoderConfig(d_model=8, d_ff=8, n_head=n_head, n_steps=n_steps)
    return Classifier(name, 5, 3, cfg, seed=0).to(device)


def encoder_pictures(name, device, **sizes):
    ids, lengths = on(device, [[6, 0, 1, 2, 5]], [5])
    return viz.encoder_pictures(encoder(name, device, **sizes), ids, lengths, TOKENS, f"ctl / {name}", name,
                                ["x", "y", "z"])


def seq2attn_model(name="seq2attn", **options):
    return seq2attn.Seq2Attn(seq2attn.model_config(name, d_embedding=8, d_hidden=8, **options), 9, 7, sos_id=2, seed=0)


def seq2attn_pictures(model, device):
    src, lengths = on(device, [[4, 5, 6]], [3])
    return viz.seq2attn_pictures(model.to(device), src, lengths, 5, ["x", "y", "z"], OUT_VOCAB, "lookup", "s")


def retrieval_pictures(name, device):
    task = tasks.RetrievalTask(2, 3, 5)
    x, _, prefs = task.batch(64, np.random.default_rng(0))
    cfg = compositional.CRTConfig(searches=2, retrievals=3, d_model=12)
    model = compositional.CRTModel(name, task.in_dim, cfg, seed=0).to(device)
    return viz.retrieval_pictures(model, *on(device, x), prefs, f"retrieval / {name}")


def sort_model(name, device):
    cfg = abstractor.AbstractorConfig(d_model=8, d_ff=8, n_head=2, n_encoder_layers=1, n_decoder_layers=1,
                                      n_abstractor_layers=2)
    return abstractor.build_seq2seq(name, 11, 10, cfg, d_src=4, seed=0).to(device)


def objects(device, n=5, d=4):
    return on(device, np.random.default_rng(0).standard_normal((1, n, d)).astype(np.float32))[0]


def relational_pictures(device, activation="sigmoid"):
    cfg = abstractor.SimplifiedConfig(d_model=8, n_relations=2, d_key=4, activation=activation)
    model = abstractor.RelationalClassifier(4, 3, 1, cfg, seed=0).to(device)
    return viz.relational_pictures(model, objects(device, 3), ["o1", "o2", "o3"], "set", "r", ["no", "yes"])


def coda_seq2seq(device):
    cfg = EncoderDecoderConfig(d_model=8, d_ff=8, n_head=2, n_encoder_layers=2, n_decoder_layers=1)
    return CoDASeq2SeqTransformer(7, 7, cfg, n_src_tokens=6, seed=0).to(device)


class CountingBackend:
    """viz's ``backend``, counting its device-to-host transfers (everything else is the real module's)."""

    def __init__(self):
        self.transfers = 0

    def __getattr__(self, name):
        return getattr(backend, name)

    def to_numpy(self, x):
        self.transfers += 1
        return backend.to_numpy(x)


@pytest.fixture
def counted(monkeypatch):
    """Plotting moves data to the host explicitly, once per picture: this counts viz's transfers."""
    counting = CountingBackend()
    monkeypatch.setattr(viz, "backend", counting)
    return counting


def heatmaps(picture):
    return [p for p in picture.panels if p.kind == "heatmap"]


# --- collectors: which maps, their shapes and ranges, on every device -----------------------------------------

@pytest.mark.parametrize("name,gated", [("ndr", True), ("transformer-rel-gate", True), ("transformer", False),
                                        ("transformer-geom", False), ("transformer-compositional", False)])
def test_encoder_pictures_show_gates_and_every_head_at_every_step(name, gated, device, counted):
    pictures = encoder_pictures(name, device)
    unit = "search" if name == "transformer-compositional" else "head"
    assert [p.name for p in pictures] == [f"{name}-gates"] * gated + [f"{name}-attention-{unit}00",
                                                                     f"{name}-attention-{unit}01"]
    assert counted.transfers == len(pictures) + 1      # one per picture, one for the predicted class
    if gated:
        gates = pictures[0].panels[0]
        assert gates.values.shape == (3, 5) and gates.rows == ["step 1", "step 2", "step 3"] and gates.cols == TOKENS
        assert ((gates.values > 0) & (gates.values < 1)).all()
    attention = pictures[-1]
    assert [p.title for p in attention.panels] == [f"step {k}, {unit} 1" for k in (1, 2, 3)]
    for p in attention.panels:
        assert isinstance(p.values, np.ndarray) and p.values.shape == (5, 5) and p.rows == p.cols == TOKENS
        assert (p.values >= 0).all() and (p.values.sum(axis=1) <= 1 + 1e-5).all()
    assert "ctl / " + name in attention.title and "→ predicted" in attention.title


def test_collectors_leave_the_model_as_they_found_it(device):
    model = encoder("transformer-coda", device)
    model.train()
    viz.encoder_pictures(model, *on(device, [[6, 0, 1, 2, 5]], [5]), TOKENS, "t", "t", ["x", "y", "z"])
    attn = model.encoder.layer.attn
    assert model.training and all(m.training for _, m in model.named_modules())
    assert "forward" not in vars(attn) and not attn.record        # the per-call hook is gone
    s = seq2attn_model()
    seq2attn_pictures(s, device)
    assert "forward" not in vars(s.attention) and s.training


def test_coda_encoder_pictures_factor_m_into_tanh_e_and_the_gate(device):
    pictures = encoder_pictures("transformer-coda", device, n_head=2, n_steps=2)
    coda = [p for p in pictures if "-coda-step" in p.name]
    assert [p.name for p in coda] == ["transformer-coda-coda-step01", "transformer-coda-coda-step02"]
    for p in coda:
        titles = [q.title for q in p.panels]
        assert titles == ["head 0: tanh(E)", "head 0: 2·sigmoid(N)", "head 0: M", "head 1: tanh(E)",
                          "head 1: 2·sigmoid(N)", "head 1: M", "tanh(E), all heads", "2·sigmoid(N), all heads",
                          "M, all heads"]
        e, g, m = (q.values for q in p.panels[:3])
        np.testing.assert_allclose(e * g, m, atol=1e-6)          # M = tanh(E) ⊙ 2σ(N)
        assert (np.abs(e) < 1).all() and ((g > 0) & (g <= 1)).all()
        assert [q.kind for q in p.panels[-3:]] == ["hist"] * 3 and (p.panels[-1].vmin, p.panels[-1].vmax) == (-1, 1)
    attention = [p for p in pictures if "-attention-" in p.name]
    assert all(q.vmin == -1 for p in attention for q in p.panels)  # M can be negative


@pytest.mark.parametrize("name", ["compositional", "compositional-mlp", "mha"])
def test_retrieval_pictures_show_search_maps_and_value_scores(name, device, counted):
    pictures = retrieval_pictures(name, device)
    maps = pictures[0]
    assert [p.title for p in maps.panels] == (["head 0", "head 1"] if name == "mha" else ["search 0", "search 1"])
    assert all(np.allclose(np.diag(p.values), 0) for p in maps.panels)        # an object never finds itself
    if name == "mha":
        assert len(pictures) == 1
        return
    assert counted.transfers == 2                        # the search maps; the value scores of two pictures
    per_search, per_truth = (p.panels[0] for p in pictures[1:])
    assert per_search.values.shape == (2, 3)
    np.testing.assert_allclose(per_search.values.sum(axis=1), 1, rtol=1e-5)   # mean of distributions over r
    assert per_truth.values.shape == (6, 6) and per_truth.rows[5] == "task search 1, retrieval 2"


def test_seq2attn_pictures_show_one_hot_attention_up_to_eos_and_the_temperature(device, counted):
    model = seq2attn_model(temperature="fixed", tau_init=2.0)
    (picture,) = seq2attn_pictures(model, device)
    assert counted.transfers == 2                        # the picture, and the predicted tokens
    attention, tau = picture.panels
    assert attention.values.shape == (5, 3) and attention.cols == ["x", "y", "z"]
    assert set(np.unique(attention.values)) <= {0.0, 1.0} and (attention.values.sum(axis=1) == 1).all()
    assert tau.kind == "bars" and np.allclose(tau.values, 2.0) and tau.rows == attention.rows
    model.out.bias.data[3] = 100.0                        # every step now predicts <eos>: nothing after it is shown
    (picture,) = seq2attn_pictures(model, device)
    assert picture.panels[0].rows == ["1 <eos>"] and len(picture.panels[1].values) == 1


def test_seq2seq_baseline_has_soft_attention_and_no_temperature(device):
    (picture,) = seq2attn_pictures(seq2attn_model("seq2seq"), device)
    assert len(picture.panels) == 1
    np.testing.assert_allclose(picture.panels[0].values.sum(axis=1), 1, rtol=1e-5)


@pytest.mark.parametrize("name,expected", [
    ("abstractor", ["encoder-attention", "abstractor0-relations", "abstractor0-symbol-attention"]),
    ("abstractor-ablation", ["encoder-attention", "abstractor0-relations", "abstractor0-symbol-attention"]),
    ("transformer-seq2seq", ["encoder-attention"]),
])
def test_sort_pictures_show_relations_of_every_layer_and_head(name, expected, device, counted):
    pictures = viz.seq2seq_pictures(sort_model(name, device), objects(device), 5, 10, [f"o{i}" for i in range(5)],
                                    "sort", "e")
    assert [p.name for p in pictures] == [f"e-{n}" for n in expected]
    assert counted.transfers == len(pictures) + 1        # and one for the predicted order
    for p in pictures:                                    # 1 encoder layer, 2 Abstractor layers; 2 heads
        assert len(p.panels) == (2 if p.name == "e-encoder-attention" else 4)
        assert all(((q.values >= 0) & (q.values <= 1)).all() for q in p.panels)
    if name == "abstractor-ablation":                      # symbols (queries) read the objects (keys)
        assert pictures[1].panels[0].rows[0] == "s0" and pictures[1].panels[0].cols[0] == "o0"


def test_coda_seq2seq_pictures_show_each_encoder_layer(device):
    pictures = viz.seq2seq_pictures(coda_seq2seq(device), *on(device, [[1, 2, 3, 4]]), 3, 1, list("abcd"), "mlu",
                                    "m", ["<pad>", "<sos>", "<eos>", "0", "1", "2", "3"])
    assert [p.name for p in pictures] == ["m-encoder-attention", "m-coda-layer1", "m-coda-layer2"]
    assert "→ predicted" in pictures[0].title and len(pictures[1].panels) == 2 * 3 + 3


@pytest.mark.parametrize("activation", ["sigmoid", "linear"])
def test_relational_pictures_show_every_relation(activation, device):
    (picture,) = relational_pictures(device, activation)
    assert [p.title for p in picture.panels] == ["layer 1, relation 0", "layer 1, relation 1"]
    for p in picture.panels:
        assert p.values.shape == (3, 3)
        if activation == "linear":                        # unbounded: a scale symmetric about 0
            assert p.vmin == -p.vmax == -np.abs(p.values).max()
    assert picture.title.startswith("set → predicted ")


def test_token_labels_must_match_the_input():
    with pytest.raises(ValueError, match="4 token labels for 5 positions"):
        viz.encoder_pictures(encoder("ndr", "cpu"), np.array([[6, 0, 1, 2, 5]]), np.array([5]), TOKENS[:4], "t",
                             "t", ["x", "y", "z"])


# --- learning curves (viz.learning_curves; report.run_curves and report(…, plot_dir) read run directories) ---

# two runs' logs: the first has a diverged last evaluation (a loss, no metrics), the second other steps
LOG_A = [{"step": 10, "train_loss": 2.5, "valid": 0.25, "test": 0.5, "wall_s": 1.0},
         {"step": 20, "train_loss": 1.5, "valid": 0.75, "test": 0.625, "wall_s": 2.0},
         {"step": 30, "train_loss": None, "wall_s": 3.0}]
LOG_B = [{"step": 15, "train_loss": 3.0, "valid": 0.5, "test": 0.25, "gate_mean": 0.5, "wall_s": 1.0}]
CURVE_RUNS = [("a", LOG_A, 20), ("b", LOG_B, None)]


def test_learning_curves_hold_the_logs_points_and_mark_the_selected_steps():
    picture = viz.learning_curves(CURVE_RUNS, "t")
    assert [p.title for p in picture.panels] == ["train_loss", "valid", "test", "gate_mean"]   # logs' order
    for panel in picture.panels:
        assert panel.kind == "curves" and panel.cols == [10, 15, 20, 30] and panel.rows == ["a", "b"]
        assert panel.marks == [20, None]
        key = panel.title
        for row, log in zip(panel.values, (LOG_A, LOG_B)):   # every point is the log's, NaN where it has none
            got = {s: v for s, v in zip(panel.cols, row) if not np.isnan(v)}
            assert got == {e["step"]: e[key] for e in log if e.get(key) is not None}, key
    train_loss, valid = picture.panels[:2]
    assert (train_loss.vmin, train_loss.vmax) == (None, None) and (valid.vmin, valid.vmax) == (0, 1)


def write_run(d, log, best_step, task="ctl", seed=0):
    """A finished run directory as training leaves it: results.json and metrics.jsonl."""
    os.makedirs(d)
    results = {"task": task, "model": "ndr", "preset": "cpu", "seed": seed, "steps": log[-1]["step"],
               "metrics": {"valid": 0.5}, "best_step": best_step, "wall_s": 1.0, "ms_per_step": 1.0,
               "config": {"task": task, "model": "ndr", "preset": "cpu", "seed": seed, "steps": 30,
                          "model_config": {}, "options": None}}
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(results, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in log)
    return str(d)


def test_run_curves_read_the_log_and_mark_results_best_step(tmp_path):
    d = write_run(tmp_path / "run", LOG_A, best_step=20)
    (picture,) = report.run_curves(d)
    assert [p.title for p in picture.panels] == ["train_loss", "valid", "test"]
    assert all(p.marks == [20] for p in picture.panels) and "step 20" in picture.title
    np.testing.assert_array_equal(picture.panels[1].values, [[0.25, 0.75, np.nan]])
    scan = write_run(tmp_path / "scan", LOG_B, best_step=None)   # SCAN selects nothing: the last is marked
    assert report.run_curves(scan)[0].panels[0].marks == [15]


def test_run_curves_without_a_log_warn_and_draw_nothing(tmp_path, capsys):
    d = write_run(tmp_path / "run", LOG_A, best_step=20)
    os.remove(os.path.join(d, "metrics.jsonl"))
    assert report.run_curves(d) == []
    assert "warning: no learning curves for" in capsys.readouterr().err


def test_report_draws_the_runs_curves_side_by_side(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a = write_run(tmp_path / "a", LOG_A, best_step=20)
    b = write_run(tmp_path / "b", LOG_B, best_step=15, seed=1)
    paths = report.report([a, b], plot_dir=str(tmp_path / "pics"))
    assert paths == [str(tmp_path / "pics" / "learning-curves.png")] and png_size(paths[0])[0] > 0
    assert f"wrote {paths[0]}" in capsys.readouterr().out


def test_plot_draws_the_runs_learning_curves(pairwise_run, tmp_path, capsys):
    """--plot of a trained run: its curves are its metrics.jsonl, the mark its results.json's best_step."""
    pytest.importorskip("matplotlib")
    pics = str(tmp_path / "pics")
    assert train.main(["--plot", "--out", pairwise_run, "--example", "5 41", "--plot-dir", pics]) == 0
    with open(os.path.join(pairwise_run, "results.json")) as f:
        best = json.load(f)["best_step"]
    log = read_log(os.path.join(pairwise_run, "metrics.jsonl"))
    (picture,) = report.run_curves(pairwise_run)
    assert [p.title for p in picture.panels] == [k for k in log[0] if k not in ("step", "wall_s")]
    for panel in picture.panels:
        assert panel.cols == [e["step"] for e in log] and panel.marks == [best]
        np.testing.assert_array_equal(panel.values[0], [e[panel.title] for e in log])
    assert f"wrote {os.path.join(pics, 'learning-curves.png')}" in capsys.readouterr().out


# --- PNGs -----------------------------------------------------------------------------------------------------

def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def figure_size(picture):
    """The PNG's size in pixels (width, height) that viz.figure_inches promises."""
    w, h = viz.figure_inches(picture)
    return round(w * viz.DPI), round(h * viz.DPI)


def one_of_each_kind():
    """A small picture from every collector (the one with the fewest panels), on the CPU."""
    groups = [encoder_pictures("ndr", "cpu", n_head=1, n_steps=2), encoder_pictures("transformer-coda", "cpu",
              n_head=1, n_steps=1), retrieval_pictures("compositional", "cpu"), seq2attn_pictures(seq2attn_model(),
              "cpu"), viz.seq2seq_pictures(sort_model("abstractor", "cpu"), objects("cpu"), 5, 10, list("abcde"), "s"),
              relational_pictures("cpu", "linear")]
    tokens = [f"t{i}" for i in range(33)]                           # over 32 tokens: smaller cells
    large = viz.Picture("large", "33 tokens", [viz.Panel(np.eye(33), "p", rows=tokens, cols=tokens)])
    return [min(group, key=lambda p: len(p.panels)) for group in groups] + \
        [p for p in groups[1] if "coda" in p.name][:1] + [large] + \
        [viz.learning_curves(CURVE_RUNS, "two runs")]              # heatmaps, histograms; small cells; curves


def test_every_kind_of_picture_is_a_png_of_the_expected_size(tmp_path):
    pytest.importorskip("matplotlib")
    pyplot_before = "matplotlib.pyplot" in sys.modules
    pictures = one_of_each_kind()
    paths = viz.write_pictures(pictures, str(tmp_path / "plots"))
    assert paths == [str(tmp_path / "plots" / f"{p.name}.png") for p in pictures]
    for picture, path in zip(pictures, paths):
        assert os.path.getsize(path) > 1000
        assert png_size(path) == figure_size(picture), picture.name
    assert pyplot_before or "matplotlib.pyplot" not in sys.modules    # headless: no pyplot, no GUI backend


def test_figure_size_grows_with_the_grid():
    panel = viz.Panel(np.zeros((2, 3)), "p", rows=["a", "b"], cols=["x", "y", "z"])
    # a panel is 2.5 + 0.25·columns by 1.75 + 0.25·rows inches, plus 0.25 inch per title line and 0.25 more
    assert figure_size(viz.Picture("n", "t", [panel])) == (325, 275)
    assert figure_size(viz.Picture("n", "t", [panel] * 3, ncols=2)) == (650, 500)
    wide = viz.Panel(np.zeros((2, 33)), "p", rows=["a", "b"], cols=[str(i) for i in range(33)])
    assert figure_size(viz.Picture("n", "t", [wide])) == (675, 250)   # 2.5 + 33/8 inches, up to 1/4


# --- without matplotlib ----------------------------------------------------------------------------------------

# --- train.py --plot -------------------------------------------------------------------------------------------

TINY_PAIRWISE = ["--task", "pairwise", "--model", "abstractor-simplified", "--steps", "2", "--eval-every", "2",
                 "--no-progress"]


@pytest.fixture(scope="module")
def pairwise_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run") / "pairwise")
    assert train.main(TINY_PAIRWISE + ["--out", out]) == 0
    return out


# --- without matplotlib ----------------------------------------------------------------------------------------

@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)         # `import matplotlib` now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)


@pytest.mark.parametrize("argv", [["--plot", "--out", "RUN"], ["--report", "RUN", "--plot-dir", "pictures"]],
                         ids=["plot", "report"])
def test_pictures_without_matplotlib_are_one_line_and_exit_2(argv, pairwise_run, no_matplotlib, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert train.main([pairwise_run if a == "RUN" else a for a in argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "draws PNGs with matplotlib" in err and "pip install matplotlib" in err
    assert not out and not os.listdir(tmp_path) and not os.path.exists(os.path.join(pairwise_run, "plots"))


def test_training_needs_no_matplotlib(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; import train; "
            f"sys.exit(train.main({TINY_PAIRWISE + ['--out', str(tmp_path / 'run')]!r}))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_plot_command_writes_pngs(pairwise_run, capsys):
    pytest.importorskip("matplotlib")
    assert train.main(["--plot", "--resume", pairwise_run, "--task", "pairwise", "--example", "5 41"]) == 0
    path = os.path.join(pairwise_run, "plots", example_name("5 41") + "-relations.png")
    assert f"wrote {path}" in capsys.readouterr().out and png_size(path)[0] > 0


@pytest.mark.parametrize("argv,message", [
    (["--plot"], "--plot needs --out DIR"),
    (["--evaluate"], "--evaluate needs --out DIR"),
    (["--analyze"], "--analyze needs --out DIR"),
    (["--plot", "--out", "/nonexistent/run"], "no run directory /nonexistent/run"),
    (["--example", "5 41"], "--example goes with --plot"),
])
def test_plot_command_errors_are_one_line(argv, message, capsys):
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plot_command_checks_the_run(pairwise_run, tmp_path, capsys):
    assert train.main(["--plot", "--out", str(tmp_path)]) == 2
    assert "holds no checkpoint.npz" in capsys.readouterr().err
    assert train.main(["--plot", "--out", pairwise_run, "--model", "abstractor"]) == 2
    assert "holds a pairwise / abstractor-simplified checkpoint, not --model abstractor" in capsys.readouterr().err
    assert train.main(["--plot", "--out", pairwise_run, "--example", "5 5"]) == 2
    assert "2 distinct object indices in 0..63" in capsys.readouterr().err


# Every recipe's --plot glue on an untrained tiny model (task, model, settings, a good and a bad --example).
RECIPE_CASES = [
    ("ctl", "ndr", dict(d_model=8, d_ff=8, n_steps=2), "101 d a b", "101 z"),
    ("retrieval", "compositional", dict(d_model=12), None, "anything"),
    ("lookup", "seq2attn", dict(d_embedding=8, d_hidden=8), "100 t3 t1 .", "100 t9"),
    ("sort", "abstractor", dict(d_model=8, d_ff=8), "17 3 40 29 5 11 46 0 33 21", "1 2 3"),
    ("set", "abstractor-simplified", {}, "0 40 80", "0 40 81"),
    ("mlu", "transformer-seq2seq-coda", dict(d_model=8, d_ff=8, n_head=2, d_head=4, train_size=100), "x=1,y=2,x+y",
     "x=1;y"),
]


@pytest.mark.parametrize("task,model,settings,good,bad", RECIPE_CASES, ids=[f[0] for f in RECIPE_CASES])
def test_every_recipe_draws_its_examples(task, model, settings, good, bad):
    recipe = recipes.recipe_for(task)(train.make_config(task, model, **settings))
    recipe.load_task()
    net = recipe.build_model()
    pictures = recipe.plot_examples(net, [])
    assert pictures and all(p.title.startswith(f"{task} / {model}") for p in pictures)
    if good:
        assert all(p.name.startswith(example_name(good) + "-") for p in recipe.plot_examples(net, [good]))
    with pytest.raises(ValueError, match="--example"):   # a bad user value: train.py makes it a UsageError
        recipe.plot_examples(net, [bad])
