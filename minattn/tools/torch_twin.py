"""The NDR classifier written again in PyTorch eager: an independent check of minattn's NDR, and the
reference its step time is compared with (``python -m minattn.tools.gpucheck --only steps``, on the
GPU or with ``--device cpu``).

torch is not a dependency of minattn: this module is only imported where torch is installed.
``TorchNDR(model)`` computes what the minattn model ``Classifier("ndr", ...)`` computes, op for op
(Csordás et al. 2022, §3 Eqs. 5–10: geometric attention in log space, the directional term, the copy
gate), from a copy of its weights, so that ``tests/tools/test_torch_twin.py`` can check that both
give the same logits and gradients before any time is compared.
"""
import numpy as np
import torch
from torch import nn

from minattn import backend
from minattn import functional as F
from minattn.attention.geometric import constants
from minattn.models.encoder import Classifier


class TorchNDR(nn.Module):
    """Classifier("ndr") in PyTorch: its parameters (stored as minattn stores them: x @ W), its ops."""

    def __init__(self, model):
        super().__init__()
        layer, self.cfg, self.consts = model.encoder.layer, model.cfg, {}
        att, self.H = layer.attn, model.cfg.n_head

        def P(*params):   # minattn's parameters, side by side along their last axis
            return nn.Parameter(torch.cat([torch.as_tensor(backend.to_numpy(p.data)) for p in params], -1))
        self.embedding, self.w_qkv, self.w_o = P(model.encoder.embedding.weight), P(att.w_qkv), P(att.w_o)
        self.b_q = nn.Parameter(P(att.b_q).data.reshape(-1))          # minattn's is (heads, 1, d_head)
        self.w_s, self.b_s = P(att.direction.weight), P(att.direction.bias)
        self.alpha, self.beta, self.gamma = P(att.alpha), P(att.beta), P(att.gamma)
        self.norm_merge, self.norm_out = nn.LayerNorm(self.cfg.d_model), nn.LayerNorm(self.cfg.d_model)
        for mine, theirs in ((self.norm_merge, layer.norm_merge), (self.norm_out, layer.norm_out)):
            mine.weight, mine.bias = P(theirs.weight), P(theirs.bias)
        # [W1 of the feed-forward | W1 of the gate]
        self.w1 = P(layer.ff.fc1.weight, layer.gate.fc1.weight)
        self.b1 = P(layer.ff.fc1.bias, layer.gate.fc1.bias)
        self.w2, self.b2 = P(layer.ff.fc2.weight), P(layer.ff.fc2.bias)
        self.wg, self.bg = P(layer.gate.fc2.weight), P(layer.gate.fc2.bias)
        self.w_head, self.b_head = P(model.head.weight), P(model.head.bias)

    def constants(self, T, device):
        """minattn's scan order (perm, inv) and mask j > i (``right``) for length T, in torch."""
        if (T, device) not in self.consts:
            c = constants(T, np.zeros((), np.float32))
            self.consts[T, device] = tuple(torch.as_tensor(a, device=device)
                                           for a in (c.perm, c.inv, c.right))
        return self.consts[T, device]

    def attention(self, x, key_mask):
        """Geometric attention with the directional term (Eqs. 7–10), as GeometricAttention."""
        B, T, C = x.shape
        H, cfg = self.H, self.cfg
        dh = C // H
        b = torch.cat([self.b_q, self.b_q.new_zeros(2 * C), self.b_s])
        y = x.reshape(B * T, C) @ torch.cat([self.w_qkv, self.w_s], 1) + b
        q, k, v = y[:, :3 * C].reshape(B, T, 3, H, dh).permute(2, 0, 3, 1, 4)
        k = torch.nn.functional.dropout(k, cfg.attention_dropout, self.training)
        s = y[:, 3 * C:].reshape(B, T, H, 2).permute(0, 2, 1, 3)
        perm, inv, right = self.constants(T, x.device)
        bs = s * self.beta + self.gamma
        z = self.alpha * (q @ k.transpose(-1, -2)) + torch.where(right, bs[..., 1:], bs[..., :1])
        invalid = torch.eye(T, dtype=torch.bool, device=x.device) | ~key_mask[:, None, None, :]
        z = z.masked_fill(invalid, F.MASKED)
        # −log(1 − σ(z)); log A = z − Σ_scan softplus
        softplus = torch.nn.functional.softplus(z)
        scan = softplus.gather(-1, perm.expand_as(z)).cumsum(-1).gather(-1, inv.expand_as(z))
        A = torch.exp(z - scan)
        return ((A @ v).transpose(1, 2).reshape(B * T, C) @ self.w_o).reshape(B, T, C)

    def layer(self, h, key_mask):
        """The copy-gated layer (Eqs. 5–6), as minattn's CopyGateLayer."""
        B, T, d = h.shape
        drop = lambda t, p: torch.nn.functional.dropout(t, p, self.training)
        a = self.norm_merge(h + drop(self.attention(h, key_mask), self.cfg.dropout))
        hidden = drop(torch.relu(a.reshape(B * T, d) @ self.w1 + self.b1), self.cfg.dropout)
        u = self.norm_out(hidden[:, :-d] @ self.w2 + self.b2)
        g = torch.sigmoid(hidden[:, -d:] @ self.wg + self.bg)
        # closes a column's whole gate, without rescaling
        if self.training and self.cfg.gate_dropout:
            g = g * (torch.rand(B * T, 1, device=g.device) >= self.cfg.gate_dropout)
        return h + g.reshape(B, T, d) * (u.reshape(B, T, d) - h)

    def forward(self, ids, lengths):
        B, T = ids.shape
        key_mask = torch.arange(T, device=ids.device)[None, :] < lengths[:, None]
        h = self.embedding[ids]
        for _ in range(self.cfg.n_steps):
            h = self.layer(h, key_mask)
        return h[torch.arange(B, device=ids.device), lengths - 1] @ self.w_head + self.b_head



def twin_step(run, inputs, device="cpu"):
    """The torch twin's training step on the same batch as minattn's (``inputs``: ids, lengths,
    labels, from ``bench.ndr_step``), and the wait for its device: (step, sync)."""
    tdev = "cuda" if device == "gpu" else "cpu"
    if tdev == "cpu":
        torch.set_num_threads(1)     # as minattn's one BLAS thread
    cfg = run.model_config
    twin = TorchNDR(Classifier("ndr", 19, 8, cfg)).to(tdev)
    tx, tlen, ty = (torch.as_tensor(backend.to_numpy(a), device=tdev) for a in inputs)
    topt = torch.optim.AdamW(twin.parameters(), lr=run.lr, weight_decay=run.weight_decay)

    def step():
        loss = torch.nn.functional.cross_entropy(twin(tx, tlen), ty)
        topt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), run.grad_clip)
        topt.step()
    return step, (torch.cuda.synchronize if tdev == "cuda" else (lambda: None))
