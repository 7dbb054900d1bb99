"""CoDA's Mathematical Language Understanding task (Tay et al. 2019) with a character-level encoder–decoder,
softmax or CoDA attention. Section numbers (§) without "paper" are those of docs/coda.md.
"""
import dataclasses

import numpy as np

from .. import backend, optim, viz
from .. import functional as F
from ..attention import coda
from ..data import MLUTask, Ragged, Seq2SeqSplit
from ..engine import eval_mode, no_grad
from ..models.transformer import CoDASeq2SeqTransformer, EncoderDecoderConfig, Seq2SeqTransformer
from .base import Recipe, RunConfig, UsageError, example_name, plot_sample, sample_name


@dataclasses.dataclass
class MLUConfig(coda.CoDAConfig, EncoderDecoderConfig):
    """The encoder–decoder's settings (models/transformer.py EncoderDecoderConfig), CoDA's (``coda_*``, read
    only by transformer-seq2seq-coda) and the run's."""
    train_size: int = 200_000      # distinct training pairs (--train-size); valid 2,000 and test 5,000 stay fixed
    warmup: int = 1000             # steps of linear learning-rate warm-up, then lr·√(warmup/step)
    eval_train: int = 2000         # training pairs whose greedy accuracy is reported as "train"


class WarmupAdamW(optim.AdamW):
    """AdamW (β 0.9/0.98, ε 1e-9; §6) whose rate rises linearly to ``lr`` over ``warmup`` steps,
    then decays as lr·√(warmup/t) (Vaswani et al. 2017, §5.3, with the peak given directly). The rate is a
    function of the step count alone, so --resume continues the schedule exactly."""

    def __init__(self, params, lr, warmup, weight_decay=0.0):
        super().__init__(params, lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
        self.peak, self.warmup = lr, warmup

    def step(self):
        t = self.t + 1
        self.lr = self.peak * min(t / self.warmup, (self.warmup / t) ** 0.5) if self.warmup else self.peak
        super().step()


# "cpu" (the default; project choices, as the paper gives none, §6): a 2+2-layer post-LN encoder–decoder,
# d 128, 4 heads of 32, d_ff 512, dropout 0.1 (embeddings, FF outputs, attention weights), LayerNorm ε 1e-5,
# interleaved sinusoidal positions, untied embeddings; AdamW without decay, peak lr 1e-3 after 1,000
# warm-up steps, batch 128, no clipping, 5,000 steps on 200k distinct pairs, evaluated every 500.
# CoDA: β = 1/√d_k (N = G/d_k, §3). In a 300-step smoke run (seed 0) at β = 1, exactly paper Eq. 10
# (``--set coda_beta=1``), the mean gate started at 0.013 and passed 0.05 only after ~200 steps, with 0%
# validation sequence accuracy at step 200; at 1/√d_k it stayed near 0.55, with 16% (both 17% at step 300).
MODEL = MLUConfig(d_model=128, n_head=4, d_head=32, d_ff=512, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1,
                  attention_dropout=0.1, ln_eps=1e-5, pe_layout="interleaved", coda_beta=1 / 32 ** 0.5)
CPU = dict(steps=5000, batch_size=128, eval_every=500)
# "paper": the same model (T2T's "tiny" size), 100,000 steps at batch 512 on 10.8M pairs (the paper's 12M
# split 9:1; generating them takes ~1 min and ~9 GB of host memory), warm-up 4,000, evaluated every 5,000
# steps; the held-out sets stay the fixed 2,000 + 5,000 pairs.
PAPER = dict(steps=100_000, batch_size=512, eval_every=5000)
PAPER_DATA = dict(train_size=10_800_000, warmup=4000)


def mlu_config(task, model, preset):
    run, mc = (PAPER, dataclasses.replace(MODEL, **PAPER_DATA)) if preset == "paper" else (CPU, MODEL)
    return RunConfig(task=task, model=model, preset=preset, lr=1e-3, weight_decay=0.0, grad_clip=0.0,
                     batching="shuffled", eval_batch_size=1000, model_config=dataclasses.replace(mc), **run)


def _prefix(split, n):
    """The first n examples of a Seq2SeqSplit (generation order is random, so a fair sample)."""
    n = min(n, len(split))
    return Seq2SeqSplit(Ragged(split.inputs.tokens, split.inputs.offsets[:n + 1]),
                        Ragged(split.targets.tokens, split.targets.offsets[:n + 1]), split.lines[:n],
                        split.in_vocab, split.out_vocab)


class MLU(Recipe):
    """MLU with the character-level encoder–decoder, softmax (``transformer-seq2seq``) or CoDA everywhere
    (``transformer-seq2seq-coda``; §6): cross-entropy under teacher forcing, <pad> ignored.
    The metric is sequence accuracy under greedy decoding: every character and the <eos> must be right
    (§5), on ``train`` (its first ``eval_train`` pairs), ``valid`` (model selection) and ``test``
    (reported at the selected evaluation). ``gate_mean``: CoDA's mean gate on 256 validation pairs.
    Measured on the 2-core machine next to another training job (one BLAS thread), cpu preset: softmax
    240–345 ms/step, CoDA 300–390 ms/step; an evaluation (9,000 greedy decodes) ~8 s. A run of 5,000 steps
    takes ~21–30 min (softmax) and ~26–34 min (CoDA)."""
    tasks = ("mlu",)
    models = ("transformer-seq2seq", "transformer-seq2seq-coda")
    report_final = ()
    config = staticmethod(mlu_config)
    PAD = 0                        # <pad> in MLUTask.out_vocab: ignored by the loss and the accuracies

    def load_task(self):
        try:
            self.task = MLUTask(n_train=self.cfg.model_config.train_size)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.train_eval = _prefix(self.task.splits["train"], self.cfg.model_config.eval_train)
        return self.task

    def build_model(self):
        cls = CoDASeq2SeqTransformer if self.cfg.model == "transformer-seq2seq-coda" else Seq2SeqTransformer
        n_out = len(self.task.out_vocab)   # output class c is output token c (greedy feeds it back)
        try:
            return cls(n_out, n_out, self.cfg.model_config, n_src_tokens=len(self.task.in_vocab), seed=self.cfg.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None

    def optimizer(self, params):
        return WarmupAdamW(params, self.cfg.lr, self.cfg.model_config.warmup, self.cfg.weight_decay)

    def batches(self, rng):
        return self.task.splits["train"].batches(self.cfg.batch_size, rng, self.cfg.batching)

    def _arrays(self, batch):
        """Device arrays: source ids, source mask, decoder input [<sos>, y_1..y_{T−1}] and targets."""
        src, src_lengths, tgt, _ = batch
        tgt_in = np.concatenate([np.full((len(tgt), 1), self.task.sos, tgt.dtype), tgt[:, :-1]], axis=1)
        src_mask = np.arange(src.shape[1]) < src_lengths[:, None]
        return self.to_device((src, src_mask, tgt_in, tgt))

    def loss(self, model, batch):
        src, src_mask, tgt_in, tgt = self._arrays(batch)
        logits = model(src, tgt_in, src_mask)
        correct = ((logits.data.argmax(-1) == tgt) | (tgt == self.PAD)).all(axis=1).sum()   # teacher forcing
        return F.cross_entropy(logits, tgt, ignore_index=self.PAD), {"seq_acc": correct}, len(tgt)

    def evaluate(self, model):
        result = {}
        with no_grad(), eval_mode():
            for name, split in (("train", self.train_eval), ("valid", self.task.splits["valid"]),
                                ("test", self.task.splits["test"])):
                correct = 0
                for batch in split.eval_batches(self.cfg.eval_batch_size):
                    src, src_mask, _, tgt = self._arrays(batch)
                    pred = model.greedy(src, tgt.shape[1], self.task.sos, src_mask)[0]
                    correct = correct + ((pred == tgt) | (tgt == self.PAD)).all(axis=1).sum()
                result[name] = round(float(backend.to_numpy(correct)) / len(split), 5)
        return result

    def _gate_run(self, model):
        """A teacher-forced pass over the first 256 validation pairs, for the gate's statistics."""
        src, src_mask, tgt_in, _ = self._arrays(next(_prefix(self.task.splits["valid"], 256).eval_batches(256)))
        return lambda: model(src, tgt_in, src_mask)

    def log_extra(self, model):
        if self.cfg.model != "transformer-seq2seq-coda":
            return {}
        with no_grad(), eval_mode():
            return {"gate_mean": round(coda.mean_gate(model, self._gate_run(model)), 4)}

    def analyze(self, model):
        """CoDA's gate per attention on 256 validation pairs (teacher forcing): its mean, and the shares of
        entries that erase (< 0.1) or keep (> 0.9), the near-binary gate the paper argues for (docs/coda.md §3)."""
        if self.cfg.model != "transformer-seq2seq-coda":
            raise UsageError("the analysis shows CoDA's gate: train transformer-seq2seq-coda")
        with no_grad(), eval_mode():
            stats = coda.gate_statistics(model, self._gate_run(model))
        rows = [f"{name:24s} {mean:6.3f} {low:8.3f} {high:8.3f}" for name, (mean, low, high) in stats.items()]
        return ("CoDA gate on 256 validation pairs (entries of valid queries and keys)\n"
                f"{'attention':24s} {'mean':>6s} {'< 0.1':>8s} {'> 0.9':>8s}\n" + "\n".join(rows))

    def plot_examples(self, model, texts):
        """Encoder attention and, for CoDA, tanh(E), the gate and M of every layer and head with their
        histograms, on test pairs or --example inputs ("x=85,y=-523,x*y")."""
        task, index = self.task, {c: i for i, c in enumerate(self.task.in_vocab)}
        split, examples = task.splits["test"], []
        for text in texts:
            if not text or any(c not in index for c in text):
                raise UsageError(f"--example {text!r}: use the characters {''.join(task.in_tokens)}")
            examples.append((example_name(text), np.array([index[c] for c in text]), None))
        examples = examples or [(sample_name("test", i, split), split.inputs[i], split.lines[i].split(":")[1])
                                for i in plot_sample(len(split))]
        longest = max(int(s.targets.lengths.max()) for s in task.splits.values())
        pictures = []
        for name, src, target in examples:
            tokens = [task.in_vocab[i] for i in src]
            title = f"mlu / {self.cfg.model}: {''.join(tokens)}" + (f" (target {target})" if target else "")
            pictures += viz.seq2seq_pictures(model, backend.to_device(src[None], self.cfg.device), longest, task.sos,
                                             tokens, title, name, task.out_vocab)
        return pictures
