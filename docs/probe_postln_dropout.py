"""Probe: how fast does a shared-weight encoder learn a trivial two-token lookup? (RESULTS.md, NDR section)

Task: the sequence [SOS, a, b, EOS] with a, b ∈ 0..7 and label (a + 3b) mod 8, read at EOS; fresh batches
of 128, AdamW lr 3e-4, no weight decay. It separates the optimisation difficulty of the post-LN baselines
(dropout on every sub-layer of n shared steps, the input PE) from the difficulty of CTL itself.

    python docs/probe_postln_dropout.py --model transformer-rel --n-steps 11 --dropout 0.1 --steps 1200
"""
import argparse

import numpy as np

from minattn import backend, functional as F, optim
from minattn.models.encoder import ARCHITECTURES, Classifier, EncoderConfig


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="transformer-rel", choices=list(ARCHITECTURES))
    ap.add_argument("--n-steps", type=int, default=11, help="applications of the shared layer")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--embedding-init", default="kaiming", choices=["kaiming", "normal", "xavier"])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = EncoderConfig(d_model=128, n_head=4, d_ff=256, n_steps=args.n_steps, dropout=args.dropout,
                        embedding_init=args.embedding_init)
    model = Classifier(args.model, 10, 8, cfg, seed=args.seed)     # tokens 0..9, EOS = 10, SOS = 11
    model.set_rng(backend.RNG(args.seed, "cpu"))
    opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    rng = np.random.default_rng(args.seed)
    for step in range(args.steps + 1):
        a, b = rng.integers(0, 8, 128), rng.integers(0, 8, 128)
        ids = np.stack([np.full(128, 11), a, b, np.full(128, 10)], 1)
        logits = model(ids, np.full(128, 4))
        loss = F.cross_entropy(logits, (a + 3 * b) % 8)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            acc = float((logits.data.argmax(1) == (a + 3 * b) % 8).mean())
            print(f"step {step:5d}  loss {float(loss.data):.3f}  batch accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
