"""The Abstractor paper's relational tasks (Altabaa et al. 2024): object sorting with the encoder–decoder
models, pairwise order and SET with the simplified Abstractor. Section numbers (§) without "paper" are
those of docs/abstractor.md.
"""
import dataclasses

import numpy as np

from .. import backend, viz
from .. import functional as F
from ..data import PairwiseOrderTask, SetTask, SortTask, epoch_batches, is_set
from ..engine import eval_mode, no_grad
from ..models import abstractor
from .base import Recipe, RunConfig, UsageError, example_name, plot_sample, sample_name


@dataclasses.dataclass
class SortConfig(abstractor.AbstractorConfig):
    """The sorting models' settings (AbstractorConfig; transformer-seq2seq reads only its EncoderDecoderConfig
    fields) plus the run's. Unless --steps / --eval-every are given, both are counted in epochs."""
    train_size: int = 500          # training sequences, sampled from the 70,000 pool with the run's seed
    epochs: int = 400
    eval_epochs: int = 1           # evaluate (and select the model) every this many epochs
    patience: int = 50             # stop after this many epochs without a better selection metric (0: never)
    stop_on: str = "valid_tf"      # the selection and stopping metric: "valid_tf" (the released code) or
                                   # "train_loss" (the code behind the paper's Fig. 4; see Sort)


@dataclasses.dataclass
class RelationalConfig(abstractor.SimplifiedConfig):
    """The simplified Abstractor's settings (SimplifiedConfig) plus the run's (epochs as SortConfig)."""
    train_size: int = 2015         # training samples drawn from the train pool (of 2,015 pairs; 7,000 triples)
    epochs: int = 100
    eval_epochs: int = 1
    patience: int = 0              # as SortConfig; 0: every run trains all its epochs
    cards: str = "onehot"          # SET card vectors: "onehot" (12-d) or "random64" (§6.3)


def sort_config(task, model, preset):
    """§6.1: Adam lr 1e-3 (AdamW without decay; ε 1e-8 where Keras has 1e-7), batch 512, no clipping,
    up to 400 epochs with early stopping on the validation teacher-forcing accuracy (patience 50 epochs),
    the best evaluation reported. "cpu": the same, evaluated every 10 epochs (so patience is 5 evaluations)."""
    mc = SortConfig(eval_epochs=1 if preset == "paper" else 10)
    if model == "transformer-seq2seq":
        mc = dataclasses.replace(mc, n_encoder_layers=4, n_decoder_layers=4)
    return RunConfig(task=task, model=model, preset=preset, steps=None, batch_size=512, lr=1e-3, weight_decay=0.0,
                     grad_clip=0.0, eval_every=None, eval_batch_size=2000, model_config=mc)


# §6.2–6.3: pairwise 100 epochs (sigmoid, asymmetric, no W_q/W_k bias, head Dense(32, ReLU) → 1 logit),
# SET 200 epochs (linear, symmetric with bias, d_ff 128, head → 2 logits, 2,000 training triples).
RELATIONAL = {
    "pairwise": RelationalConfig(),
    "set": RelationalConfig(activation="linear", symmetric=True, rel_bias=True, d_ff=128, head_hidden=0,
                            train_size=2000, epochs=200),
}


def relational_config(task, model, preset):
    """Adam lr 1e-3, batch 64, no clipping. Both presets are the paper's: a run takes minutes."""
    return RunConfig(task=task, model=model, preset=preset, steps=None, batch_size=64, lr=1e-3, weight_decay=0.0,
                     grad_clip=0.0, eval_every=None, eval_batch_size=2048,
                     model_config=dataclasses.replace(RELATIONAL[task]))   # a copy: runs share no config


class ObjectTask(Recipe):
    """Shared by the Abstractor recipes: the training set is ``train_size`` samples of the task's train
    pool drawn with the run's seed; Keras-style epochs (a fresh permutation, the last batch partial);
    steps and eval_every default to ``epochs`` and ``eval_epochs`` whole epochs; early stopping after
    ``patience`` epochs without a better selection metric; everything is reported at the selected
    evaluation (the reference restores the best parameters)."""
    report_final = ()

    def __init__(self, cfg):
        super().__init__(cfg)
        mc = cfg.model_config
        self.per_epoch = -(-mc.train_size // cfg.batch_size)
        cfg.steps = mc.epochs * self.per_epoch if cfg.steps is None else cfg.steps
        cfg.eval_every = mc.eval_epochs * self.per_epoch if cfg.eval_every is None else cfg.eval_every

    def stop_early(self, step, history):
        """As Keras' EarlyStopping: right after an evaluation, once ``patience`` epochs have passed since the
        selection metric last strictly improved."""
        patience = self.cfg.model_config.patience * self.per_epoch
        if not patience or not history or step % self.cfg.eval_every:
            return False
        sign = 1 if self.metric_higher_is_better else -1
        first_best = max(history, key=lambda e: (sign * e[self.select_split], -e["step"]))
        return step - first_best["step"] >= patience

    def load_task(self):
        try:
            self.task = self.make_task()
            self.train_set = self.task.splits["train"].sample(self.cfg.model_config.train_size,
                                                              np.random.default_rng([self.cfg.seed, 2]))
        except ValueError as e:
            raise UsageError(str(e)) from None
        return self.task

    def batches(self, rng):
        for idx in epoch_batches(len(self.train_set), self.cfg.batch_size, rng):
            yield self.train_set.subset(idx)

    def _objects(self, split):
        return backend.to_device(self.task.objects[split.index], self.cfg.device)

    def _plot_samples(self, texts):
        """(name, object indices) of the test samples --plot shows, or of --example texts of indices."""
        split, examples = self.task.splits["test"], []
        n, m = len(self.task.objects), split.index.shape[1]
        for text in texts:
            index = np.array([int(t) for t in text.split() if t.isdigit()])
            if len(text.split()) != m or len(set(index.tolist())) != m or not (index < n).all():
                raise UsageError(f"--example {text!r}: give {m} distinct object indices in 0..{n - 1}")
            examples.append((example_name(text), index))
        return examples or [(sample_name("test", i, split), split.index[i]) for i in plot_sample(len(split))]


class Sort(ObjectTask):
    """Object sorting with the encoder–decoder models (§6.1): cross-entropy over the 10 positions under
    teacher forcing. Model selection on the validation teacher-forcing accuracy ``valid_tf``. The greedy
    metrics — full-sequence accuracy ``valid`` and ``test`` (the reported one), element-wise ``test_elem``
    — decode 30,000 sequences (~20 s here), so they are computed once, after training, with the selected
    evaluation's parameters (``selected_only``); metrics.jsonl has ``valid_tf`` and ``train`` (greedy
    full-sequence accuracy on the training set) at every evaluation. Measured on the 2-core machine (one BLAS
    thread): ~0.46 s/step (Abstractor) and ~0.54 s/step (Transformer) at batch 500, an evaluation
    a few seconds; early stopping ends most runs before 400 epochs."""
    tasks = ("sort",)
    models = abstractor.SEQ2SEQ_MODELS
    select_split = "valid_tf"
    selected_only = ("valid", "test", "test_elem")
    config = staticmethod(sort_config)
    STOP_ON = ("valid_tf", "train_loss")

    def __init__(self, cfg):
        """``stop_on=train_loss`` is the rule of the authors' sorting script when the paper's Fig. 4 was made
        (jdlafferty/relational, May 2023: Keras ``EarlyStopping(monitor='loss', patience=10,
        restore_best_weights=True)``, 200 epochs by default): select and stop on the epoch's mean training
        loss. Nothing else is evaluated during training then (valid and test are decoded once, at the
        selected epoch), so evaluating every epoch costs nothing."""
        super().__init__(cfg)
        if cfg.model_config.stop_on not in self.STOP_ON:
            raise UsageError(f"--set stop_on={cfg.model_config.stop_on}: choose one of {', '.join(self.STOP_ON)}")
        if cfg.model_config.stop_on == "train_loss":
            self.select_split, self.metric_higher_is_better = "train_loss", False

    def make_task(self):
        return SortTask()

    def build_model(self):
        try:
            return abstractor.build_seq2seq(self.cfg.model, SortTask.START + 1, SortTask.LENGTH,
                                            self.cfg.model_config, d_src=self.task.objects.shape[1], seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def _arrays(self, split):
        to = backend.to_device
        return (self._objects(split), to(SortTask.decoder_inputs(split.labels), self.cfg.device),
                to(split.labels, self.cfg.device))

    def loss(self, model, batch):
        x, tgt_in, y = self._arrays(batch)
        logits = model(x, tgt_in)
        return F.cross_entropy(logits, y), {"tf_acc": (logits.data.argmax(-1) == y).sum()}, y.size

    def _count(self, model, split, greedy):
        """(correct sequences, correct tokens) under greedy decoding or teacher forcing, as device scalars."""
        seqs = tokens = 0
        for chunk in split.chunks(self.cfg.eval_batch_size):
            x, tgt_in, y = self._arrays(chunk)
            pred = model.greedy(x, y.shape[1], SortTask.START)[0] if greedy else model(x, tgt_in).data.argmax(-1)
            seqs, tokens = seqs + (pred == y).all(axis=1).sum(), tokens + (pred == y).sum()
        return seqs, tokens

    @staticmethod
    def _frac(count, split, per_token=False):
        return round(float(backend.to_numpy(count)) / (split.labels.size if per_token else len(split)), 5)

    def evaluate(self, model):
        if self.select_split == "train_loss":   # the loop logs the training loss itself
            return {}
        valid = self.task.splits["valid"]
        with no_grad(), eval_mode():
            return {"valid_tf": self._frac(self._count(model, valid, False)[1], valid, True),
                    "train": self._frac(self._count(model, self.train_set, True)[0], self.train_set)}

    def evaluate_selected(self, model):
        splits = self.task.splits
        with no_grad(), eval_mode():
            seqs, tokens = self._count(model, splits["test"], True)
            return {"valid": self._frac(self._count(model, splits["valid"], True)[0], splits["valid"]),
                    "test": self._frac(seqs, splits["test"]), "test_elem": self._frac(tokens, splits["test"], True)}

    def plot_examples(self, model, texts):
        """Encoder attention, the Abstractor's relation matrices and its symbols' attention, on test sequences
        or --example object indices ("17 3 40 29 5 11 46 0 33 21": 10 of the 48 objects)."""
        pictures = []
        for name, index in self._plot_samples(texts):
            title = (f"sort / {self.cfg.model}: objects {' '.join(map(str, index))} "
                     f"(target {' '.join(map(str, np.argsort(index)))})")
            pictures += viz.seq2seq_pictures(model, backend.to_device(self.task.objects[index][None], self.cfg.device),
                                             len(index), SortTask.START, [f"o{i}" for i in index], title, name)
        return pictures


class PairwiseSet(ObjectTask):
    """Pairwise order and SET with the simplified Abstractor (§6.2, §6.3): binary cross-entropy on one
    logit (pairwise) or softmax cross-entropy on two (SET); accuracy on ``train`` (the training set),
    ``valid`` and ``test``, reported at the evaluation with the lowest validation loss ``valid_loss``.
    SET cards are not images (a documented deviation): its numbers are not directly comparable with
    the paper's. About 5 ms/step on the 2-core machine: a pairwise run (3,200 steps) takes ~1 min."""
    tasks = ("pairwise", "set")
    models = abstractor.CLASSIFIER_MODELS
    select_split = "valid_loss"
    metric_higher_is_better = False
    config = staticmethod(relational_config)

    def make_task(self):
        if self.cfg.task == "pairwise":
            return PairwiseOrderTask()
        return SetTask(cards=self.cfg.model_config.cards)

    def build_model(self):
        n_out = 1 if self.cfg.task == "pairwise" else 2
        try:
            return abstractor.RelationalClassifier(self.task.objects.shape[1], self.train_set.index.shape[1], n_out,
                                                   self.cfg.model_config, seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def loss(self, model, batch):
        """(mean loss, {"acc": correct}, n) for a split or batch."""
        logits, y = model(self._objects(batch)), backend.to_device(batch.labels, self.cfg.device)
        if self.cfg.task == "pairwise":
            z, t = logits[:, 0], y.astype(logits.dtype)
            loss = -(F.logsigmoid(z) * t + F.logsigmoid(-z) * (1 - t)).mean()
            return loss, {"acc": ((z.data > 0) == (y == 1)).sum()}, len(y)
        return F.cross_entropy(logits, y), {"acc": (logits.data.argmax(-1) == y).sum()}, len(y)

    def evaluate(self, model):
        result = {}
        with no_grad(), eval_mode():
            for name, split in (("train", self.train_set), ("valid", self.task.splits["valid"]),
                                ("test", self.task.splits["test"])):
                loss = correct = 0
                for chunk in split.chunks(self.cfg.eval_batch_size):
                    chunk_loss, stats, n = self.loss(model, chunk)
                    loss, correct = loss + chunk_loss.data * n, correct + stats["acc"]
                result[name] = round(float(backend.to_numpy(correct)) / len(split), 5)
                if name == "valid":
                    result["valid_loss"] = round(float(backend.to_numpy(loss)) / len(split), 5)
        return result

    def plot_examples(self, model, texts):
        """The relation matrices of every layer and relation, on test samples or --example object indices
        (pairwise: "5 41", two of the 64 objects; set: "0 40 80", three of the 81 cards)."""
        pictures = []
        for name, index in self._plot_samples(texts):
            if self.cfg.task == "pairwise":
                tokens, classes = [f"o{i}" for i in index], ("first > second", "first < second")
                target = int(index[0] < index[1])
            else:  # a card is shown with its attribute values (number, colour, pattern, shape)
                attrs = self.task.attributes[index]
                tokens = [f"{i}:{''.join(map(str, a))}" for i, a in zip(index, attrs)]
                classes, target = ("no SET", "SET"), int(is_set(attrs))
            title = f"{self.cfg.task} / {self.cfg.model}: {' '.join(tokens)} (target {classes[target]})"
            x = backend.to_device(self.task.objects[index][None], self.cfg.device)
            pictures += viz.relational_pictures(model, x, tokens, title, name, classes)
        return pictures
