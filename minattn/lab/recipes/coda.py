"""CoDA's Mathematical Language Understanding task (Tay et al. 2019) with a character-level
encoder–decoder, softmax or CoDA attention. Section numbers (§) without "paper" are those of
docs/coda.md.
"""
import dataclasses

import numpy as np

from minattn import functional as F
from minattn.attention import coda
from minattn.data import MLUTask
from minattn.engine import eval_mode, no_grad
from minattn.models import seq2seq

from .. import viz
from .base import Recipe, Selection, WarmupSchedule, fraction, parse_tokens


@dataclasses.dataclass
class MLUOptions(WarmupSchedule):
    """The MLU run's options: its data, warm-up (WarmupSchedule) and training pairs evaluated."""
    # distinct training pairs (--train-size); valid 2,000 and test 5,000 stay fixed
    train_size: int = 200_000
    eval_train: int = 2000         # training pairs whose greedy accuracy is reported as "train"


# "paper": the paper gives no training setup (§6); the model is T2T's "tiny" size: a 2+2-layer
# post-LN encoder–decoder, d 128, 4 heads of 32, d_ff 512, dropout 0.1 (embeddings, FF outputs,
# attention weights), LayerNorm ε 1e-5, interleaved sinusoidal positions, untied embeddings; AdamW
# without decay, peak lr 1e-3 after 4,000 warm-up steps, batch 512, no clipping, 100,000 steps on
# 10.8M pairs (the paper's 12M split 9:1; generating them takes ~1 min and ~9 GB of host memory),
# evaluated every 5,000 steps; the held-out sets stay the fixed 2,000 + 5,000 pairs. Both models
# train the same run. CoDA: β = 1/√d_k (N = G/d_k, §3), where paper Eq. 10's β = 1 (``--set
# coda_beta=1``) starts the gate almost closed (RESULTS.md has both).
PAPER = {
    ("mlu", "transformer-seq2seq"): dict(
        d_model=128, n_head=4, d_head=32, d_ff=512, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1,
        attention_dropout=0.1, ln_eps=1e-5, pe_layout="interleaved", coda_beta=1 / 32 ** 0.5,
        steps=100_000, batch_size=512, eval_every=5000, eval_batch_size=1000, lr=1e-3, weight_decay=0.0,
        grad_clip=0.0, batching="shuffled", train_size=10_800_000, warmup=4000),
}
# "cpu" (the default; project choices): the same model, 5,000 steps at batch 128 on 200k distinct
# pairs, warm-up 1,000, evaluated every 500
CPU = {"*": dict(steps=5000, batch_size=128, eval_every=500, train_size=200_000, warmup=1000)}


class CoDA(Recipe):
    """MLU with the character-level encoder–decoder, softmax (``transformer-seq2seq``) or CoDA
    everywhere (``transformer-seq2seq-coda``; §6): cross-entropy under teacher forcing, <pad>
    ignored. The metric is sequence accuracy under greedy decoding: every character and the <eos>
    must be right (§5), on ``train`` (its first ``eval_train`` pairs), ``valid`` (model selection)
    and ``test`` (reported at the selected evaluation); ``gate_mean``: CoDA's on 256 valid pairs."""
    tasks = ("mlu",)
    models = seq2seq.MODELS
    PAPER, CPU = PAPER, CPU
    ROW_OF_ANY_MODEL = "transformer-seq2seq"
    ModelConfig, Options = seq2seq.CoDAEncoderDecoderConfig, MLUOptions
    selection = Selection(metric="valid")
    PAD = 0      # <pad> in MLUTask.out_vocab: ignored by the loss and the accuracies

    def load_task(self):
        self.task = MLUTask(n_train=self.cfg.options.train_size)
        self.train_eval = self.task.splits["train"].head(self.cfg.options.eval_train)

    def build_model(self):
        n_out = len(self.task.out_vocab)   # output class c is output token c (greedy feeds it back)
        build = seq2seq.MODELS[self.cfg.model]["build"]
        return build(n_out, n_out, self.cfg.model_config, n_src_tokens=len(self.task.in_vocab),
                     seed=self.cfg.seed)

    def _arrays(self, batch):
        """Device arrays: source ids and mask, decoder input [<sos>, y_1..y_{T−1}], targets."""
        src, src_lengths, tgt, _ = batch
        tgt_in = np.concatenate([np.full((len(tgt), 1), self.task.sos, tgt.dtype), tgt[:, :-1]], axis=1)
        src_mask = np.arange(src.shape[1]) < src_lengths[:, None]
        return self.to_device((src, src_mask, tgt_in, tgt))

    def loss(self, model, batch):
        src, src_mask, tgt_in, tgt = self._arrays(batch)
        logits = model(src, tgt_in, src_mask)
        # teacher forcing
        correct = ((logits.data.argmax(-1) == tgt) | (tgt == self.PAD)).all(axis=1).sum()
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
                result[name] = fraction(correct, len(split))
        return result

    def _gate_run(self, model):
        """A teacher-forced pass over the first 256 validation pairs, for the gate's statistics."""
        src, src_mask, tgt_in, _ = self._arrays(next(self.task.splits["valid"].head(256).eval_batches(256)))
        return lambda: model(src, tgt_in, src_mask)

    def log_extra(self, model):
        if seq2seq.MODELS[self.cfg.model]["gate"] != "coda":
            return {}
        with no_grad(), eval_mode():
            return {"gate_mean": round(coda.mean_gate(model, self._gate_run(model)), 4)}

    def analyze(self, model):
        """CoDA's gate per attention on 256 validation pairs (teacher forcing): its mean, and the
        shares of entries that erase (< 0.1) or keep (> 0.9), the near-binary gate the paper argues
        for (docs/coda.md §3)."""
        if seq2seq.MODELS[self.cfg.model]["gate"] != "coda":
            raise ValueError("the analysis shows CoDA's gate: train transformer-seq2seq-coda")
        with no_grad(), eval_mode():
            stats = coda.gate_statistics(model, self._gate_run(model))
        rows = [f"{name:24s} {mean:6.3f} {low:8.3f} {high:8.3f}"
                for name, (mean, low, high) in stats.items()]
        return ("CoDA gate on 256 validation pairs (entries of valid queries and keys)\n"
                f"{'attention':24s} {'mean':>6s} {'< 0.1':>8s} {'> 0.9':>8s}\n" + "\n".join(rows))

    def plot_examples(self, model, texts):
        """Encoder attention and, for CoDA, tanh(E), the gate and M of every layer and head with
        their histograms, on test pairs or --example inputs ("x=85,y=-523,x*y")."""
        task, pictures = self.task, []
        longest = max(int(s.targets.lengths.max()) for s in task.splits.values())
        inputs = self.plot_inputs(texts, lambda text: parse_tokens(text, task.in_vocab, list),
                                  lambda split, i: (split.inputs[i], split.lines[i].split(":")[1]))
        for name, src, target in inputs:
            tokens = [task.in_vocab[i] for i in src]
            title = self.plot_title("".join(tokens), target)
            pictures += viz.seq2seq_pictures(model, self.to_device([src[None]])[0], longest,
                                             task.sos, tokens, title, name, task.out_vocab)
        return pictures
