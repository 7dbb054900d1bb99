"""The suite tests itself: a catalogue of semantic mutants (issue 31 item 5). ``make mutation`` (not in CI).

Each mutant is (file, the exact original snippet, its replacement, what it breaks). The script copies the
working tree to a temporary directory once, then for each mutant: checks that the snippet occurs exactly
once in the file (an anchor that is missing or ambiguous is an ERROR, so no mutant can silently vanish),
writes the mutated file, runs the relevant tests with ``pytest -x -q`` (never tests/test_golden.py), and
restores the file. A mutant that no test kills is then run against tests/test_golden.py alone, to count
what only the 3-step snapshot catches. It prints each survivor and the share killed without and with
the golden snapshot.

    .venv/bin/python tests/mutation.py                 # the whole catalogue (18 min on 2 busy cores)
    .venv/bin/python tests/mutation.py --only geometric --no-golden
    .venv/bin/python tests/mutation.py --section definitions   # that section alone (8 min on 2 busy cores)
    .venv/bin/python tests/mutation.py --list

Mutants known to be equivalent (no test can kill them: same values) are listed in EQUIVALENT with the
reason; they are reported, not counted. The catalogue has two sections: DEFINITIONS (attention, models,
functional, the checker, data) and CORE (the textbook engine and its Accumulation, the ops/ package, nn,
optim, and the speed annex fast/). Where a rule exists twice, a fused op beside its composed form, an annex
form beside the plain one (grouped weight gradients, slice gradients, in-place/collected accumulation, the
flat optimizer buffer and its clipping), a mutant is planted in each: the annex is on under the default
environment, the plain path runs where tests ask for it (plain(), tests/test_plain_vs_fast.py,
tests/test_graph.py, tests/test_engine.py's fused-vs-composed table), and most of the annex acts only off
NumPy, which the strict test device is.

Last full run (main 006af6b + this catalogue, 2 shared cores with a training job beside it):
SCORE_PLACEHOLDER
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Mutant = namedtuple("Mutant", "file original replacement description")

# --- which tests each area runs (fast definition tests first: with -x a kill is usually a second) ----------
DEFS = ["tests/test_definitions.py", "tests/test_definitions_papers.py"]
GRAD = ["tests/test_gradient_paths.py", "tests/test_gradcheck.py"]
TESTS = {
    "minattn/attention/": DEFS + ["tests/test_ndr.py", "tests/test_abstractor.py", "tests/test_compositional.py",
                                  "tests/test_seq2attn.py"] + GRAD + ["tests/test_coda.py", "tests/test_engine.py"],
    "minattn/models/": DEFS + ["tests/test_abstractor.py", "tests/test_seq2attn.py", "tests/test_ndr.py",
                               "tests/test_compositional.py"] + GRAD + ["tests/test_coda.py"],
    "minattn/functional.py": DEFS + ["tests/test_engine.py", "tests/test_nn_optim.py"] + GRAD + ["tests/test_seq2attn.py"],
    "minattn/gradcheck.py": ["tests/test_checker.py", "tests/test_gradcheck.py"],
    "minattn/data/": ["tests/test_ndr_data.py", "tests/test_seq2attn_data.py", "tests/test_abstractor_data.py"],
    # the core: its own tests first, then the two paths side by side (under the default environment the
    # annex is on, so the textbook path runs only where a test asks for it: plain(), test_engine's fused vs
    # composed, test_graph's "textbook" half and test_plain_vs_fast)
    "minattn/engine.py": ["tests/test_engine.py", "tests/test_gradient_paths.py", "tests/test_graph.py"] + DEFS +
                         ["tests/test_gradcheck.py", "tests/test_nn_optim.py", "tests/test_plain_vs_fast.py"],
    "minattn/ops/": ["tests/test_gradient_paths.py", "tests/test_engine.py"] + DEFS +
                    ["tests/test_gradcheck.py", "tests/test_graph.py", "tests/test_coda.py", "tests/test_plain_vs_fast.py"],
    "minattn/nn.py": DEFS + ["tests/test_nn_optim.py", "tests/test_engine.py"] + GRAD + ["tests/test_plain_vs_fast.py"],
    "minattn/optim.py": ["tests/test_nn_optim.py", "tests/test_launches.py", "tests/test_train.py",
                         "tests/test_plain_vs_fast.py"],
    # the annex: most of it acts off NumPy only, which the strict device of tests/strict.py is
    "minattn/fast/flat.py": ["tests/test_launches.py", "tests/test_nn_optim.py", "tests/test_train.py",
                             "tests/test_plain_vs_fast.py"],   # its own tests (strict device) come first
    # (value tests first, then test_launches, whose launch budgets also fail when a mutant adds or drops an
    # array operation, and its flat-buffer tests)
    "minattn/fast/": ["tests/test_engine.py", "tests/test_gradient_paths.py", "tests/test_graph.py",
                      "tests/test_nn_optim.py"] + DEFS + ["tests/test_gradcheck.py", "tests/test_launches.py",
                                                          "tests/test_plain_vs_fast.py", "tests/test_train.py"],
    "tests/": ["tests/test_golden_modes.py"],
}


def tests_for(path):
    return next(v for k, v in TESTS.items() if path.startswith(k))


M = Mutant
A, MOD = "minattn/attention/", "minattn/models/"

DEFINITIONS = [
    # --- multi-head attention (Vaswani et al. 2017) -----------------------------------------------------
    M(A + "multihead.py", "* (1.0 / math.sqrt(dh))", "* (1.0 / dh)", "MHA: 1/d instead of 1/√d"),
    M(A + "multihead.py", "* (1.0 / math.sqrt(dh))", "* 1.0", "MHA: no scaling"),
    M(A + "multihead.py", "tri = xp.arange(T_k)[None, :] <= xp.arange(T_q)[:, None]",
      "tri = xp.arange(T_k)[None, :] < xp.arange(T_q)[:, None]", "causal mask hides the query itself"),
    M(A + "multihead.py", "key_mask[:, None, None, :]", "key_mask[:, None, :, None]", "key mask on queries"),
    M(A + "multihead.py", "    return F.softmax(logits, axis=-1)", "    return F.softmax(logits, axis=-2)",
      "softmax over queries"),
    M(A + "multihead.py", "        return kv[0], kv[1]", "        return kv[1], kv[0]", "keys and values swapped"),
    M(A + "multihead.py", "            q = q + self.b_q", "            q = q - self.b_q", "query bias sign"),
    M(A + "multihead.py", "            kv = kv + self.b_kv", "            kv = kv + 2 * self.b_kv", "k/v bias doubled"),
    # --- relative attention (Dai et al. 2019 §3.3; NDR App. A) --------------------------------------------
    M(A + "relative.py", "content = (q + self.u) @", "content = q @", "term (c) dropped (no u)"),
    M(A + "relative.py", "qv = q + self.v", "qv = q", "term (d) dropped (no v)"),
    M(A + "relative.py", "position = g * position + (1 - g) * absolute", "position = g * absolute + (1 - g) * position",
      "abs/rel gate swapped"),
    M(A + "relative.py", "self.alpha * (content + position)", "self.alpha * content + position",
      "α scales the content term only"),
    M(A + "relative.py", "np.arange(-(T - 1), T)", "np.arange(T - 1, -T, -1)", "offset i − j instead of j − i"),
    M(A + "relative.py", "r_abs = r[:, T - 1:]", "r_abs = r[:, :T]", "absolute positions read negative offsets"),
    M(A + "relative.py", "[..., T - 1:T - 1 + T * (n - 1)]", "[..., T:T + T * (n - 1)]", "rel_shift off by one"),
    M(A + "relative.py", "(pe @ self.w_r)", "(pe @ self.w_q)", "positions projected by W_q"),
    # --- geometric attention (NDR Eqs. 7, 9, 10) -----------------------------------------------------------
    M(A + "geometric.py", "rank = 2 * np.abs(k - i) + (k < i)", "rank = 2 * np.abs(k - i) + (k > i)",
      "scan order: the left key wins ties"),
    M(A + "geometric.py", "invalid = backend.array_module(like).eye(T, dtype=bool)",
      "invalid = backend.array_module(like).zeros((T, T), dtype=bool)", "the diagonal is not masked"),
    M(A + "geometric.py", "self.A = xp.exp(self.z - self._scan_cumsum(self.softplus))",
      "self.A = xp.exp(self.z - self._scan_cumsum(self.softplus) + self.softplus)", "Eq. 7 without (1 − P) of ... own key"),
    M(A + "geometric.py", "return g - self._scan_cumsum(g, reverse=True)", "return g + self._scan_cumsum(g, reverse=True)",
      "GeometricWeights backward: sign of the blocking term"),
    M(A + "geometric.py", "return g - self._scan_cumsum(g, reverse=True)", "return g - self._scan_cumsum(g, reverse=False)",
      "GeometricWeights backward: scan sum the wrong way"),
    M(A + "geometric.py", "return g - self._scan_cumsum(g, reverse=True)", "return 1.01 * g - self._scan_cumsum(g, reverse=True)",
      "GeometricWeights backward: one term scaled by 1.01"),
    M(A + "geometric.py", "where(self.right, bs[..., 1:], bs[..., :1])", "where(self.right, bs[..., :1], bs[..., 1:])",
      "directions swapped (s← for j > i)"),
    M(A + "geometric.py", "blocked_scan = F.cumsum(m_scan, axis=-1) - m_scan", "blocked_scan = F.cumsum(m_scan, axis=-1)",
      "composed Eq. 7: a key blocks itself"),
    M(A + "geometric.py", "    return alpha * qk + F.where(right, bs[..., 1:], bs[..., :1])",
      "    return alpha * qk + F.where(right, bs[..., :1], bs[..., 1:])", "composed Eqs. 9-10: directions swapped"),
    M(A + "geometric.py", "bs = s * beta + gamma                                           # (B, H, T, 2): β s",
      "bs = s * beta                                           # (B, H, T, 2): β s", "γ dropped (fused)"),
    M(A + "geometric.py", "bs = s * beta + gamma                                               # (B, H, T, 2)\n",
      "bs = s * beta                                               # (B, H, T, 2)\n", "γ dropped (composed)"),
    M(A + "geometric.py", "gbs = (gz[..., None, :] * self.sides).sum(axis=-1)",
      "gbs = (gz[..., None, :] * self.sides).mean(axis=-1)", "DirectionalLogits backward: mean for sum"),
    M(A + "geometric.py", "        return gz * self.alpha, gbs * self.beta, gz * self.qk,", "        return gz, gbs * self.beta, gz * self.qk,",
      "DirectionalLogits backward: qk's gradient without α"),
    M(A + "geometric.py", "gbs * self.beta, gz * self.qk, gbs * self.s, gbs", "gbs * self.beta, gz * self.qk * 1.01, gbs * self.s, gbs",
      "DirectionalLogits backward: α's gradient ×1.01"),
    M(A + "geometric.py", "gz * self.qk, gbs * self.s, gbs\n", "gz * self.qk, gbs * self.s, gbs * 0\n",
      "DirectionalLogits backward: γ's gradient dropped"),
    M(A + "geometric.py", "A / F.maximum(A.sum(axis=-1, keepdims=True), 1e-12)",
      "A / F.maximum(A.sum(axis=-2, keepdims=True), 1e-12)", "normalised over queries"),
    M(A + "geometric.py", "q, k, v = qkv[0], self.key_dropout(qkv[1]), qkv[2]",
      "q, k, v = qkv[1], self.key_dropout(qkv[0]), qkv[2]", "queries and keys swapped"),
    M(A + "geometric.py", "s = y[:, 3 * C:].reshape(B, T, H, 2).transpose(0, 2, 1, 3)",
      "s = y[:, 3 * C:].reshape(B, T, 2, H).transpose(0, 3, 1, 2)", "direction outputs split by side, not head"),
    # --- CoDA (Tay et al. 2019) ---------------------------------------------------------------------------
    M(A + "coda.py", "gk[n0:n1] -= s.sum(axis=1)", "gk[n0:n1] += s.sum(axis=1)", "L1 backward: key gradient sign"),
    M(A + "coda.py", "gq[n0:n1, i0:i1] = ones @ s", "gq[n0:n1, i0:i1] = 1.01 * (ones @ s)", "L1 backward: query ×1.01"),
    M(A + "coda.py", "xp.abs(diff, out=diff)", "xp.square(diff, out=diff)", "squared L2 for L1"),
    M(A + "coda.py", "return gy / (1 + self.x * self.x)", "return gy / (1 + self.x)", "arctan backward"),
    M(A + "coda.py", "Arctan()(n) * (2 / math.pi)", "Arctan()(n)", "arctan not rescaled by 2/π"),
    M(A + "coda.py", "n * (n * n + 1.0) ** -0.5", "n * (n * n + 1.0) ** 0.5", "algebraic: x·√(1+x²)"),
    M(A + "coda.py", '{"tanh": F.tanh, "sigmoid": F.sigmoid}', '{"tanh": F.tanh, "sigmoid": F.tanh}',
      "Table 9: F_X = sigmoid is tanh"),
    M(A + "coda.py", '"tanh": F.tanh, "arctan"', '"tanh": F.sigmoid, "arctan"', "Table 9: F_Y = tanh is sigmoid"),
    M(A + "coda.py", "g = f_n(N - masked_mean(N, stats, axes))", "g = f_n(masked_mean(N, stats, axes) - N)",
      "Eq. 4: centring sign"),
    M(A + "coda.py", "E = E - masked_mean(E, stats, axes)", "E = E + masked_mean(E, stats, axes)", "Eq. 6: centring sign"),
    M(A + "coda.py", "g = f_n(N) * 2.0 if f_n is F.sigmoid else f_n(N)", "g = f_n(N) * 2.0",
      "Eq. 5's 2 applied to every F_Y"),
    M(A + "coda.py", "g = f_n(N) * 2.0 if f_n is F.sigmoid else f_n(N)", "g = f_n(N)", "Eq. 5 without the 2"),
    M(A + "coda.py", "(-1,) if row_mean else (-2, -1)", "(-2, -1) if row_mean else (-2, -1)", "row_mean ignored"),
    M(A + "coda.py", "xp.maximum(count, 1)", "xp.maximum(count + 1, 1)", "masked mean divides by count + 1"),
    M(A + "coda.py", "* (self.alpha * self.scale)", "* self.alpha", "E without 1/√d_k"),
    M(A + "coda.py", "* (-self.beta * self.scale)", "* (self.beta * self.scale)", "N = +L1 (sign)"),
    M(A + "coda.py", "stats = mask & key_mask[:, None, :, None]", "stats = mask", "padded queries in Mean(·)"),
    M(A + "coda.py", "self.scale = 1 / math.sqrt(self.d_head) if scale else 1.0",
      "self.scale = 1 / self.d_head if scale else 1.0", "1/d_k for 1/√d_k"),
    M(A + "coda.py", "E = (ea @ eb.swapaxes(-1, -2)) * self.alpha", "E = (ea @ eb.swapaxes(-1, -2))",
      "pairwise: α dropped"),
    M(A + "coda.py", "N = l1_distance(na, nb) * -self.beta", "N = l1_distance(na, nb) * -1.0", "pairwise: β dropped"),
    M(A + "coda.py", "a2, b2 = M @ b, M.swapaxes(-1, -2) @ a", "a2, b2 = M @ b, M.swapaxes(-1, -2) @ (a * 0.5 + 0.5 * a[:, ::-1])",
      "pairwise: B′ pools a reordered A"),
    # --- compositional attention (Mittal et al. 2022) -----------------------------------------------------
    M(A + "compositional.py", "logits = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(ds))",
      "logits = (q @ k.swapaxes(-1, -2)) * (1.0 / ds)", "search logits 1/d_s"),
    M(A + "compositional.py", ".reshape(B, S, T, R) * (1.0 / math.sqrt(ds))", ".reshape(B, S, T, R)",
      "value scores unscaled"),
    M(A + "compositional.py", "        return F.softmax(logits, axis=-1)", "        return F.softmax(logits, axis=-2)",
      "value scores normalised over tokens"),
    M(A + "compositional.py", "h = (c.reshape(B, S, T, 1, R) @ O_sr)", "h = (c.reshape(B, S, T, 1, R) @ O_sr[..., ::-1, :])",
      "retrievals mixed with the wrong weights"),
    M(A + "compositional.py", "k_bar = self.retrieval_key(O_sr)", "k_bar = self.retrieval_key(O_sr * 0 + O_sr.mean(axis=-2, keepdims=True))",
      "retrieval keys from the mean candidate"),
    M(A + "compositional.py", "+ (O_sr.reshape(-1, dv) @ w[ds:]).reshape(B, S, T, R)",
      "+ (O_sr.reshape(-1, dv) @ w[ds:] * 0.5).reshape(B, S, T, R)", "linear score (App. B.7): candidate term halved"),
    M(A + "compositional.py", "@ self.w_key + self.b_key", "@ self.w_key", "separate retrieval keys without bias"),
    M(A + "compositional.py", "            h = F.concat([h, self.own(x)], axis=-1)",
      "            h = F.concat([self.own(x), h], axis=-1)", "concat option: own projection first"),
    M(A + "compositional.py", "invalid = xp.eye(T, dtype=bool) if mask_diagonal else None", "invalid = None",
      "mask_diagonal ignored"),
    # --- relational cross-attention (Altabaa et al. 2024) -------------------------------------------------
    M(A + "relational.py", "q, k = qk[0], qk[n_proj - 1]", "q, k = qk[n_proj - 1], qk[0]", "RCA: q and k swapped"),
    M(A + "relational.py", 'self.scale = 1 / math.sqrt(self.d_head) if scale == "sqrt" else 1.0',
      'self.scale = 1 / self.d_head if scale == "sqrt" else 1.0', "RCA: 1/d for 1/√d"),
    M(A + "relational.py", "return out if mask is None else F.masked_fill(out, ~mask, 0.0)", "return out",
      "elementwise σ_rel ignores the mask"),
    M(A + "relational.py", "v = (symbols.reshape(B * T, D) @ self.w_v + self.b_v)", "v = (x.reshape(B * T, D) @ self.w_v + self.b_v)",
      "RCA values from the objects (no bottleneck)"),
    M(A + "relational.py", "R = qk[0] @ qk[n_proj - 1].swapaxes(-1, -2)", "R = qk[n_proj - 1] @ qk[0].swapaxes(-1, -2)",
      "simplified RCA: q and k swapped"),
    M(A + "relational.py", "y = (A @ symbols[:, None]) @ self.w_p + self.b_p", "y = (A @ symbols[:, None]) @ self.w_p",
      "simplified RCA: P^r bias dropped"),
    M(A + "relational.py", "xp.arange(T)[None, :] - xp.arange(T)[:, None], -R, R)", "xp.arange(T)[:, None] - xp.arange(T)[None, :], -R, R)",
      "position-relative symbols: offset i − j"),
    # --- additive / Gumbel attention (Korrel et al. 2019) -------------------------------------------------
    M(A + "additive.py", "return F.exp(self.log_tau)", "return self.log_tau", "latent τ = θ instead of exp θ"),
    M(A + "additive.py", "return 1.0 / (F.softplus(self.w_tau(query)) + self.inv_tau_max)",
      "return F.softplus(self.w_tau(query)) + self.inv_tau_max", "conditioned τ not inverted"),
    M(A + "additive.py", "return 1.0 / (F.softplus(self.w_tau(query)) + self.inv_tau_max)",
      "return 1.0 / (F.sigmoid(self.w_tau(query)) + self.inv_tau_max)", "conditioned τ: sigmoid for softplus"),
    M(A + "additive.py", "            return self.tau_init", "            return 1.0", "fixed τ ignored"),
    M(A + "additive.py", "hidden = F.relu(projected", "hidden = F.tanh(projected", "Eq. 5: tanh for ReLU"),
    M(A + "additive.py", "return Tensor(F.one_hot_argmax(e))", "return F.softmax(e)", "evaluation: soft for argmax"),
    M(A + "additive.py", 'hard=self.activation == "gumbel_st"', "hard=False", "straight-through never hard"),
    M(A + "additive.py", "xp.where(key_mask, 0.0, MASKED)", "xp.where(key_mask, MASKED, 0.0)", "mask inverted"),
    M(A + "additive.py", "(query @ self.w1_query)", "(query @ self.w1_query * 0.5)", "query half of W1 halved"),
    # --- functional -------------------------------------------------------------------------------------
    M("minattn/functional.py", "soft = softmax((logits + noise) / tau, axis=axis)",
      "soft = softmax((logits + noise) * tau, axis=axis)", "Gumbel: ×τ for /τ"),
    M("minattn/functional.py", "soft = softmax((logits + noise) / tau, axis=axis)",
      "soft = softmax(logits / tau + noise, axis=axis)", "Gumbel: noise not tempered"),
    M("minattn/functional.py", "idx = data.argmax(axis=axis)", "idx = data.argmin(axis=axis)", "one-hot of the argmin"),
    M("minattn/functional.py", "x.dtype.type(1 / (1 - p))", "x.dtype.type(1 - p)", "F.dropout scales by 1 − p"),
    # layer norm (Ba et al. 2016): the composed form (the definition, the textbook path) and the fused op
    M("minattn/ops/fused.py", "    return xc / E.sqrt(var + eps) * weight + bias", "    return xc / (var + eps) * weight + bias",
      "composed LayerNorm: variance for std"),
    M("minattn/ops/fused.py", "    var = R.mean(xc * xc, -1, keepdims=True)", "    var = R.sum(xc * xc, -1, keepdims=True)",
      "composed LayerNorm: sum for mean"),
    M("minattn/ops/fused.py", "self.rstd = 1 / xp.sqrt(var + x.dtype.type(self.eps))", "self.rstd = 1 / (var + x.dtype.type(self.eps))",
      "fused LayerNorm: variance for std"),
    M("minattn/ops/fused.py", "var = (xc * xc).mean(axis=-1, keepdims=True)", "var = (xc * xc).sum(axis=-1, keepdims=True)",
      "fused LayerNorm: sum for mean"),
    # --- NDR encoder (models/encoder.py) -----------------------------------------------------------------
    M(MOD + "encoder.py", "x = self.norm1(x + self.drop1(self.attn(x, key_mask=key_mask)))",
      "x = x + self.drop1(self.norm1(self.attn(x, key_mask=key_mask)))", "post-LN: norm inside the residual"),
    M(MOD + "encoder.py", "return self.norm2(x + self.drop2(self.ff(x)))", "return self.norm1(x + self.drop2(self.ff(x)))",
      "post-LN: second LN is the first"),
    M(MOD + "encoder.py", "return h + g * (u - h)", "return u + g * (h - u)", "copy gate inverted"),
    M(MOD + "encoder.py", "a = self.norm_merge(h + self.drop_att(self.attn(h, key_mask=key_mask)))",
      "a = self.norm_merge(self.drop_att(self.attn(h, key_mask=key_mask)))", "copy-gate layer: no attention residual"),
    M(MOD + "encoder.py", "u = F.tanh(f) if self.tanh_out else self.norm_out(f)", "u = F.tanh(f) if self.tanh_out else f",
      "NDR: no LN on the data path"),
    M(MOD + "encoder.py", "g = self.gate_dropout(F.sigmoid(self.gate.fc2(hidden[:, -d:])))",
      "g = self.gate_dropout(F.tanh(self.gate.fc2(hidden[:, -d:])))", "gate: tanh for σ"),
    M(MOD + "encoder.py", "f = self.ff.fc2(hidden[:, :self.ff.fc1.weight.shape[1]])",
      "f = self.ff.fc2(hidden[:, -self.ff.fc1.weight.shape[1]:])", "data path reads the gate's hidden units"),
    M(MOD + "encoder.py", "Dropout(cfg.gate_dropout, scale=False, shared_axes=(-1,))",
      "Dropout(cfg.gate_dropout, scale=True, shared_axes=(-1,))", "gate dropout rescales"),
    M(MOD + "encoder.py", "h = self.input_dropout(h + self.pe[:T])",
      "h = self.input_dropout(h * math.sqrt(self.cfg.d_model) + self.pe[:T])", "NDR encoder: √d on the embeddings"),
    M(MOD + "encoder.py", "h = self.input_dropout(h + self.pe[:T])", "h = self.input_dropout(h + self.pe[1:T + 1])",
      "NDR encoder: PE shifted by one"),
    M(MOD + "encoder.py", "steps = n_steps or (self.cfg.n_steps if self.training or not self.cfg.n_steps_eval else self.cfg.n_steps_eval)",
      "steps = n_steps or self.cfg.n_steps", "n_steps_eval ignored"),
    M(MOD + "encoder.py", "else xp.zeros(B, dtype=lengths.dtype)", "else xp.ones(B, dtype=lengths.dtype)",
      "SOS readout reads column 1"),
    M(MOD + "encoder.py", "column = lengths - 1 if", "column = lengths - 2 if", "EOS readout off by one"),
    M(MOD + "encoder.py", "key_mask = xp.arange(T)[None, :] < lengths[:, None]",
      "key_mask = xp.arange(T)[None, :] <= lengths[:, None]", "classifier: padding key visible"),
    M(MOD + "encoder.py", "self.pe = sinusoidal_positions(64, cfg.d_model) if self.input_pe else None",
      'self.pe = sinusoidal_positions(64, cfg.d_model, "concat") if self.input_pe else None', "NDR: concat PE layout"),
    # the architecture table (ARCHITECTURES rows: layer, attention, input positions)
    M(MOD + "encoder.py", '"transformer-geom": Architecture(\n        layer="postln",',
      '"transformer-geom": Architecture(\n        layer="gate",', "table: transformer-geom gets the NDR layer"),
    M(MOD + "encoder.py", "normalize=True, rng=rng)", "normalize=False, rng=rng)", "table: transformer-geom unnormalised"),
    M(MOD + "encoder.py", "abs_gate=True, rng=rng)", "abs_gate=False, rng=rng)", "table: absrel without the abs gate"),
    M(MOD + "encoder.py", 'layer="gate", gate="copy",', 'layer="gate-tanh", gate="copy",', "table: NDR with the tanh layer"),
    M(MOD + "encoder.py", '"transformer-compositional": Architecture(\n        layer="postln", input_pe=True,',
      '"transformer-compositional": Architecture(\n        layer="postln",', "table: compositional without input PE"),
    # --- encoder–decoder (models/seq2seq.py) ----------------------------------------------------------------
    M(MOD + "seq2seq.py", "h * math.sqrt(self.cfg.d_model) + self.pe[offset:offset + T]", "h + self.pe[offset:offset + T]",
      "seq2seq: no √d"),
    M(MOD + "seq2seq.py", "h * math.sqrt(self.cfg.d_model) + self.pe[offset:offset + T]",
      "h * math.sqrt(self.cfg.d_model) + self.pe[:T]", "seq2seq: decoding step ignores its offset"),
    M(MOD + "seq2seq.py", "return self.ffn(self.norm(x + self.attn(x, key_mask=key_mask)))",
      "return self.ffn(x + self.norm(self.attn(x, key_mask=key_mask)))", "encoder layer: LN inside the residual"),
    M(MOD + "seq2seq.py", "return self.norm(x + self.dropout(self.ff(x)))", "return x + self.norm(self.dropout(self.ff(x)))",
      "FF block: LN inside the residual"),
    M(MOD + "seq2seq.py", "y = self.self_norm(y + self.self_attn(y, causal=True))",
      "y = self.self_norm(y + self.self_attn(y, causal=False))", "decoder self-attention not causal"),
    M(MOD + "seq2seq.py", "y = norm(y + attn(y, context=contexts[i], key_mask=key_mask))",
      "y = norm(y + attn(y, context=contexts[0], key_mask=key_mask))", "decoder reads context 0 only"),
    M(MOD + "seq2seq.py", "y = norm(y + attn(y, context=contexts[i], key_mask=key_mask))",
      "y = norm(y + attn(y, context=contexts[i]))", "decoder cross-attention ignores the source mask"),
    M(MOD + "seq2seq.py", "y = norm(y + attn(y, kv=kv, key_mask=key_mask))", "y = norm(y + attn(y, kv=kv))",
      "greedy step ignores the source mask"),
    M(MOD + "seq2seq.py", "groups = [tuple(range(n_contexts))] if", "groups = [tuple(reversed(range(n_contexts)))] if",
      "multi-attention decoder: contexts in reverse order"),
    M(MOD + "seq2seq.py", "self.pe = sinusoidal_positions(64, d, cfg.pe_layout)", "self.pe = sinusoidal_positions(64, d)",
      "seq2seq: interleaved PE for concat"),
    M(MOD + "seq2seq.py", 'row_mean=role != "encoder"', "row_mean=False", "CoDA decoder: matrix-wide Mean(·)"),
    M(MOD + "seq2seq.py", "d_head=cfg.d_head or cfg.d_model, bias=True, init=cfg.init)",
      "d_head=cfg.d_head or cfg.d_model // cfg.n_head, bias=True, init=cfg.init)", "Keras MHA: heads d/H wide"),
    M(MOD + "seq2seq.py", "return self.head(y)", "return self.head(y * 1.0001)", "seq2seq head input ×1.0001"),
    M(MOD + "encoder.py", "                h = self.layer(h, key_mask=key_mask)", "                h = self.layer(h, key_mask=None)",
      "encoder steps ignore padding"),
    M(MOD + "compositional.py", "h, A, c = self.attn(self.enc2(F.relu(self.enc1(x))), return_weights=True)",
      "h, A, c = self.attn(self.enc2(self.enc1(x)), return_weights=True)", "CRT encoder MLP without ReLU"),
    M(MOD + "compositional.py", "            h = F.concat([h, self.own(x)], axis=-1)", "            h = F.concat([h, self.own(x) * 0.5], axis=-1)",
      "CRT MHA: own projection halved"),
    M(MOD + "compositional.py", "invalid = search_mask(key_mask, T, self.mask_diagonal, x.data)", "invalid = search_mask(key_mask, T, False, x.data)",
      "CRT MHA: an object finds itself"),
    # --- Abstractor -------------------------------------------------------------------------------------
    M(MOD + "abstractor.py", "else self.rca(E, A, key_mask=key_mask)", "else self.rca(A, E, key_mask=key_mask)",
      "RCA: objects and symbols swapped"),
    M(MOD + "abstractor.py", "A = self.rca_norm(A + rel) if", "A = self.rca_norm(rel) if", "no residual onto the symbols"),
    M(MOD + "abstractor.py", "self.rca(A, context=E, key_mask=key_mask) if self.ablation",
      "self.rca(E, context=A, key_mask=key_mask) if self.ablation", "Ablation: queries from E"),
    M(MOD + "abstractor.py", "A = self.self_norm(A + self.self_attn(A, key_mask=key_mask))",
      "A = self.self_norm(self.self_attn(A, key_mask=key_mask))", "symbol self-attention without residual"),
    M(MOD + "abstractor.py", "A = self.dropout(A * math.sqrt(self.cfg.d_model) + self.pe[:T])", "A = self.dropout(A + self.pe[:T])",
      "A⁰ without √d"),
    M(MOD + "abstractor.py", "A = self.dropout(A * math.sqrt(self.cfg.d_model) + self.pe[:T])",
      "A = self.dropout(A * math.sqrt(self.cfg.d_model))", "A⁰ without PE"),
    M(MOD + "abstractor.py", "A = layer(A, E, key_mask)", "A = layer(A, A, key_mask)", "Abstractor layers read A as objects"),
    M(MOD + "abstractor.py", "A.append(self.abstractors[1](A[0], src_mask))", "A.append(self.abstractors[1](E, src_mask))",
      "(e): the 2nd Abstractor reads E"),
    M(MOD + "abstractor.py", "A = A if self.cfg.attend_a1 else A[1:]", "A = A if self.cfg.attend_a1 else A[:1]",
      "(e): the decoder reads A1 for A2"),
    M(MOD + "abstractor.py", 'return A if self.cfg.architecture in ("a", "b") else [E] + A',
      'return A if self.cfg.architecture in ("a", "b") else A + [E]', "(d)/(e): context order"),
    M(MOD + "abstractor.py", 'return A if self.cfg.architecture in ("a", "b") else [E] + A',
      'return A if self.cfg.architecture in ("a", "b", "d") else [E] + A', "(d) reads A only"),
    M(MOD + "abstractor.py", "cfg = dataclasses.replace(cfg, n_encoder_layers=0)", "cfg = dataclasses.replace(cfg)",
      "(a) keeps an encoder"),
    M(MOD + "abstractor.py", "w = F.softmax((q @ self.binding.swapaxes(-1, -2)) * self.scale, axis=-1)",
      "w = F.softmax((q @ self.binding.swapaxes(-1, -2)) * self.scale, axis=-2)", "symbolic attention over positions"),
    M(MOD + "abstractor.py", "S = self.symbols[:T] if", "S = self.symbols[1:T + 1] if", "positional symbols shifted"),
    M(MOD + "abstractor.py", "return self.dropout(self.ffn(self.rca(X, A, key_mask)))",
      "return self.dropout(self.ffn(self.rca(A, X, key_mask)))", "simplified layer: objects and symbols swapped"),
    M(MOD + "abstractor.py", "A = layer(A, X)", "A = layer(A, A)", "classifier layers read A as objects"),
    M(MOD + "abstractor.py", "h = F.relu(self.hidden(h))", "h = self.hidden(h)", "classifier: no ReLU"),
    # --- seq2attn ---------------------------------------------------------------------------------------
    M(MOD + "seq2attn.py", "state = _map(lambda h: h * context, state)", "state = _map(lambda h: h + context, state)",
      "Eq. 12: full focus adds"),
    M(MOD + "seq2attn.py", "F.concat([context, x], axis=-1)", "F.concat([x, context], axis=-1)", "decoder input order"),
    M(MOD + "seq2attn.py", "values = emb if self.cfg.embedding_values else keys", "values = keys",
      "Eq. 9: encoder states for embeddings"),
    M(MOD + "seq2attn.py", "query, trans_state = self.transcoder(x, trans_state)",
      "query, trans_state = trans_state[-1], self.transcoder(x, trans_state)[1]", "query before reading y_{t−1}"),
    M(MOD + "seq2attn.py", "rows, last = backend.array_module(src).arange(B), lengths - 1",
      "rows, last = backend.array_module(src).arange(B), lengths * 0 + n - 1", "final state at the padded end"),
    M(MOD + "seq2attn.py", "prev = xp.where(gold, tgt[:, t], prev)", "prev = xp.where(gold, prev, tgt[:, t])",
      "teacher forcing inverted"),
    M(MOD + "seq2attn.py", "self.cfg.teacher_forcing if training else 0.0)", "self.cfg.teacher_forcing if training else 1.0)",
      "evaluation loss fed the gold prefix"),
    M(MOD + "seq2attn.py", "scale = (valid.sum() / B).astype(logits.dtype)", "scale = (valid.sum() / (B * m)).astype(logits.dtype)",
      "loss: per token, not per sequence"),
    M(MOD + "seq2attn.py", "valid = xp.arange(m)[None, :] < lengths[:, None]", "valid = xp.arange(m)[None, :] <= lengths[:, None]",
      "loss counts a padding target"),
    M(MOD + "seq2attn.py", "trans_state, p = state, self.decoder_init", "trans_state, p = state, state",
      "decoder starts from the encoder state, not h_0"),
    M(MOD + "seq2attn.py", "query = state[-1][0] if self.decoder.lstm else state[-1]",
      "query = state[0][0] if self.decoder.lstm else state[0]", "baseline query from the bottom layer"),
    M(MOD + "seq2attn.py", "state = [(p[2 * i], p[2 * i + 1]) for i", "state = [(p[2 * i + 1], p[2 * i]) for i",
      "LSTM h_0 and c_0 swapped"),
    M(MOD + "seq2attn.py", "            x = s[0] if self.lstm else s", "            x = s[1] if self.lstm else s",
      "stacked LSTM passes c up"),
    # --- data (the tasks' definitions) ---------------------------------------------------------------------
    M("minattn/data/listops.py", "(cval[i_lo] + cval[i_hi]) // 2", "cval[i_hi]", "ListOps MED: upper middle only"),
    M("minattn/data/listops.py", "np.add.reduceat(cval, starts) % 10])", "np.add.reduceat(cval, starts) % 9])",
      "ListOps SM modulo 9"),
    M("minattn/data/listops.py", "i_min = starts + np.minimum.reduceat(cval * 8 + pos, starts) % 8",
      "i_min = starts + 7 - np.minimum.reduceat(cval * 8 + (7 - pos), starts) % 8", "ListOps MIN: last tie wins"),
    M("minattn/data/classification.py", "    x[:, 0] = V + 1\n    for row", "    x[:, 0] = V\n    for row",
      "collate: SOS is EOS"),
    M("minattn/data/classification.py", "    x[np.arange(B), n + 1] = V", "    x[np.arange(B), n] = V",
      "collate (ragged): EOS over the last token"),
    M("minattn/data/ndr.py", "value = (a[1] + b[1]) % 10 if op == 0 else (a[1] * b[1]) % 10",
      "value = (a[1] + b[1]) % 10 if op == 0 else (a[1] + b[1]) % 10", "arithmetic: * evaluates as +"),
    M("minattn/data/abstractor.py", "self.splits = _object_splits(rng, index, np.argsort(index, axis=1),",
      "self.splits = _object_splits(rng, index, np.argsort(np.argsort(index, axis=1), axis=1),",
      "sorting targets: ranks for argsort"),
    M("minattn/data/abstractor.py", "labels[:, :-1]], axis=1)", "labels[:, 1:]], axis=1)", "teacher forcing shifted wrongly"),
    # --- the checker (gradcheck.py) -----------------------------------------------------------------------
    M("minattn/gradcheck.py", "atol=1e-6, rtol=1e-4", "atol=1e-6, rtol=1e-1", "rtol 1000× looser"),
    M("minattn/gradcheck.py", "atol=1e-6, rtol=1e-4", "atol=1e-2, rtol=1e-4", "atol 10,000× looser"),
    M("minattn/gradcheck.py", "eps=1e-6, atol", "eps=1e-3, atol", "eps 1000× larger"),
    M("minattn/gradcheck.py", "not (np.isfinite(analytic) and np.isfinite(numeric)) or ", "",
      "NaN/inf gradients accepted"),
    M("minattn/gradcheck.py", "not (np.isfinite(analytic) and np.isfinite(numeric))", "not np.isfinite(analytic)",
      "NaN numerical gradient accepted"),
    M("minattn/gradcheck.py", "rng.standard_normal(y.shape), backend.device_of(y.data))",
      "np.ones(y.shape), backend.device_of(y.data))", "all-ones upstream gradient"),
    M("minattn/gradcheck.py", "            failures.append(f\"integer input of shape {a.shape} received a gradient\")",
      "            pass", "integer inputs may get gradients"),
    M("minattn/gradcheck.py", "        raise GradcheckError(f\"output dtype is {y.dtype}",
      "        print(f\"output dtype is {y.dtype}", "float32 computation accepted"),
    M("minattn/gradcheck.py", "for _ in range(n_directions))]", "for _ in range(n_directions))][:0]", "no direction checked"),
    M("minattn/gradcheck.py", "break\n    for a in int_tensors", "continue\n    for a in int_tensors",
      "(equivalent) keep checking after a failure"),
    # --- the suite's own modes (tests/) ---------------------------------------------------------------------
    M("tests/test_golden.py", "        pytest.fail(f\"MINATTN_UPDATE_GOLDEN=1", "        (lambda *a, **k: None)(f\"MINATTN_UPDATE_GOLDEN=1",
      "update mode passes"),
    M("tests/test_split_checksums.py", "        pytest.fail(f\"MINATTN_REGEN_GOLDEN=1", "        return (lambda *a, **k: None)(f\"MINATTN_REGEN_GOLDEN=1",
      "regen mode passes"),
]

# Anchored to the core as rewritten by issue 33 (engine.py, ops/, nn.py, optim.py) and its speed annex
# (fast/). A rule that exists twice, a fused or annex form beside its plain form, is planted in both: the
# annex is proven equal to the plain path (tests/test_plain_vs_fast.py, tests/test_graph.py), so a bug in
# either must die. A snippet that is gone is reported as an ERROR, never skipped.
O, FA = "minattn/ops/", "minattn/fast/"
CORE = [
    # --- engine: the textbook backward and its Accumulation ----------------------------------------------
    M("minattn/engine.py", "if gx.shape != t.data.shape or gx.dtype != t.data.dtype:", "if gx.shape != t.data.shape:",
      "dtype guard removed"),
    M("minattn/engine.py", "        leaf.grad = g.copy() if leaf.grad is None else leaf.grad + g",
      "        leaf.grad = g.copy()", "leaf gradients not accumulated across backward calls"),
    M("minattn/engine.py", "        leaf.grad = g.copy() if leaf.grad is None else leaf.grad + g",
      "        leaf.grad = g if leaf.grad is None else leaf.grad + g", "a leaf's .grad is an array someone else holds"),
    M("minattn/engine.py", "        t._g = gx if t._g is None else t._g + gx", "        t._g = gx",
      "a tensor used twice keeps one gradient"),
    M("minattn/engine.py", "axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and g.shape[i + lead] != 1)",
      "axes = tuple(range(lead))", "sum_to: size-1 axes not reduced"),
    M("minattn/engine.py", "    nodes.sort(key=_by_seq, reverse=True)", "    nodes.sort(key=_by_seq)",
      "graph walked from the leaves up"),
    # --- annex: fast/accumulate.py (the same four methods, faster) ---------------------------------------
    M(FA + "accumulate.py", "            leaf.grad = leaf.grad + g", "            leaf.grad = g",
      "annex: leaf gradients not accumulated across backward calls"),
    M(FA + "accumulate.py", "            leaf.grad = g if self.owned else g.copy()", "            leaf.grad = g",
      "annex: a leaf's .grad is an array someone else holds"),
    M(FA + "accumulate.py", "            self.owned = id(t) in self.owns", "            self.owned = True",
      "annex: a handed-over gradient taken as owned"),
    M(FA + "accumulate.py", "                t._g = prev + gx\n", "                t._g = gx\n",
      "annex: a tensor used twice keeps one gradient"),
    M(FA + "accumulate.py", "                prev += gx", "                prev -= gx", "annex: in-place accumulation subtracts"),
    M(FA + "accumulate.py", "            if id(t) in self.owns:", "            if True:",
      "annex: adds in place into an array it was handed"),
    M(FA + "accumulate.py", "            prev.append(gx)", "            pass", "annex (off NumPy): a third gradient dropped"),
    M(FA + "accumulate.py", "            t._g = [prev, gx]", "            t._g = [gx]", "annex (off NumPy): a second gradient dropped"),
    M(FA + "accumulate.py", "return stacked.sum(axis=0) if arrays[0].size > 1 else xp.cumsum(stacked, axis=0)[-1]",
      "return stacked.sum(axis=0) if arrays[0].size > 1 else stacked[0]", "annex: one-element sums keep the first term"),
    M(FA + "accumulate.py", "            return sum_to(backend.array_module(gs[0]).stack(gs), shape)",
      "            return sum_to(gs[0], shape)", "annex SumTo: one gradient of many"),
    M(FA + "accumulate.py", "        return sum_arrays([sum_to(g, shape) for g in gs])", "        return sum_to(gs[0], shape)",
      "annex SumTo: shapes that differ keep the first"),
    # --- ops/elementwise.py --------------------------------------------------------------------------------
    M(O + "elementwise.py", "        return gy, -gy", "        return gy, gy", "Sub: sign of b"),
    M(O + "elementwise.py", "        return (gy * self.b if _needs_grad(self, 0) else None,\n                gy * self.a if",
      "        return (gy * self.a if _needs_grad(self, 0) else None,\n                gy * self.b if", "Mul: swapped"),
    M(O + "elementwise.py", "        return ga, (-ga * self.y if", "        return ga, (ga * self.y if", "Div: sign"),
    M(O + "elementwise.py", "        ga = gy / self.b", "        ga = gy * self.b", "Div: times b"),
    M(O + "elementwise.py", "        return gy * (self.p * self.x ** (self.p - 1))", "        return gy * (self.p * self.x ** self.p)",
      "Pow: exponent"),
    M(O + "elementwise.py", "        return gy * self.c\n", "        return gy * self.c * 1.01\n", "MulScalar ×1.01"),
    M(O + "elementwise.py", "xp.where(self.cond, gy, zero) if _needs_grad(self, 0) else None",
      "xp.where(self.cond, zero, gy) if _needs_grad(self, 0) else None", "Where: branches swapped"),
    M(O + "elementwise.py", "        return array_module(gy).where(self.mask, gy.dtype.type(0), gy)", "        return gy",
      "MaskedFill: masked entries get gradient"),
    M(O + "elementwise.py", "        return gy * self.mask\n\n\ndef maximum", "        return gy\n\n\ndef maximum", "ClampMin: no mask"),
    M(O + "elementwise.py", "        return gy * self.mask\n\n\nclass Softplus", "        return gy\n\n\nclass Softplus", "ReLU: no mask"),
    M(O + "elementwise.py", "        return gy * self.y\n", "        return gy * self.y * 1.01\n", "Exp ×1.01"),
    M(O + "elementwise.py", "        return gy / self.x\n", "        return gy * self.x\n", "Log: times x"),
    M(O + "elementwise.py", "        return gy * 0.5 / self.y", "        return gy * 0.5 * self.y", "Sqrt"),
    M(O + "elementwise.py", "        return gy * array_module(gy).sign(self.x)", "        return gy", "Abs: no sign"),
    M(O + "elementwise.py", "        return gy * (1 - self.y * self.y)", "        return gy * (1 - self.y)", "Tanh"),
    M(O + "elementwise.py", "        return gy * self.y * (1 - self.y)", "        return gy * self.y", "Sigmoid: term dropped"),
    M(O + "elementwise.py", "        return gy * (0.5 * (array_module(gy).tanh(0.5 * self.x) + 1))  # sigmoid(x)",
      "        return gy * (0.5 * (array_module(gy).tanh(self.x) + 1))", "Softplus"),
    M(O + "elementwise.py", "        return gy * (0.5 * (1 - array_module(gy).tanh(0.5 * self.x)))",
      "        return gy * (0.5 * (1 + array_module(gy).tanh(0.5 * self.x)))", "LogSigmoid: σ(x) for σ(−x)"),
    M(O + "elementwise.py", "        return gy * self.mask, gy * ~self.mask\n\n\nclass Minimum",
      "        return gy * ~self.mask, gy * self.mask\n\n\nclass Minimum", "Maximum: swapped"),
    M(O + "elementwise.py", "        return gy * self.mask, gy * ~self.mask\n\n\nclass AddScalar",
      "        return gy * ~self.mask, gy * self.mask\n\n\nclass AddScalar", "Minimum: swapped"),
    M(O + "elementwise.py", "        return -gy\n", "        return gy\n", "Neg: sign"),
    # --- ops/reductions.py ---------------------------------------------------------------------------------
    M(O + "reductions.py", "    axes = sorted(a % len(shape) for a in axes)", "    axes = sorted(axes)",
      "reductions: negative axes not normalised"),
    M(O + "reductions.py", "    axes = sorted(a % len(shape) for a in axes)", "    axes = [a % len(shape) for a in axes]",
      "reductions: several axes expanded unsorted"),
    M(O + "reductions.py", "        return array_module(gy).broadcast_to(g, self.shape)", "        return g",
      "Sum: broadcast removed (the engine sums to shape)"),
    M(O + "reductions.py", "        return super().backward(gy / self.n)", "        return super().backward(gy)", "Mean: no 1/n"),
    M(O + "reductions.py", "        return (self.mask * g / count).astype(gy.dtype)", "        return (self.mask * g).astype(gy.dtype)",
      "Max: ties each get the whole gradient"),
    M(O + "reductions.py", "        count = self.mask.sum(axis=self.axis, keepdims=True)", "        count = 1",
      "Max: ties each get the whole gradient (count)"),
    M(O + "reductions.py", "        return _cumsum(gy, self.axis, not self.reverse)", "        return _cumsum(gy, self.axis, self.reverse)",
      "Cumsum: same direction back"),
    # --- ops/matmul.py, and its grouped forms (fast/grouped.py) ------------------------------------------
    M(O + "matmul.py", "        return (_mm(gy, self.b.swapaxes(-1, -2)) if", "        return (_mm(gy, self.b) if",
      "MatMul: b not transposed"),
    M(O + "matmul.py", "_mm(self.a.swapaxes(-1, -2), gy) if _needs_grad(self, 1) else None)",
      "_mm(self.a.swapaxes(-1, -2), gy) * 1.01 if _needs_grad(self, 1) else None)", "MatMul: b's gradient ×1.01"),
    M(O + "matmul.py", "        return super().backward(gy) + ((gy,) if len(self.inputs) == 3 else ())",
      "        return super().backward(gy) + ((gy * 1.01,) if len(self.inputs) == 3 else ())", "Linear: bias ×1.01"),
    M(FA + "grouped.py", "(_mm(gy, self.b.swapaxes(-1, -2)) if _needs_grad(self, 0) else None), Outer(self.a, gy)",
      "(_mm(gy, self.b) if _needs_grad(self, 0) else None), Outer(self.a, gy)", "grouped MatMul: b not transposed"),
    M(FA + "grouped.py", "            return _mm(items[0].a.swapaxes(-1, -2), items[0].g)\n",
      "            return _mm(items[0].a.swapaxes(-1, -2), items[0].g * 1.01)\n", "grouped Outer ×1.01"),
    M(FA + "grouped.py", "xp.concatenate([i.g for i in items]))", "xp.concatenate([i.g for i in items][::-1]))",
      "grouped Outer.total: rows paired wrongly"),
    M(FA + "grouped.py", "            return sum_arrays([sum_to(i.a * i.b, i.shape) for i in items])",
      "            return sum_to(first.a * first.b, first.shape)", "grouped ProductSum: two shapes keep the first"),
    M(FA + "grouped.py", "return sum_to(xp.stack([i.a for i in items]) * xp.stack([i.b for i in items]), first.shape)",
      "return sum_to(xp.stack([i.a for i in items]) * xp.stack([i.b for i in items][::-1]), first.shape)",
      "grouped ProductSum: stacked pairs mismatched"),
    M(FA + "grouped.py", "        return self.grad_x(gy), ProductSum(gy, self.xhat, self.weight.shape), gy",
      "        return self.grad_x(gy), ProductSum(gy, self.xhat * 1.01, self.weight.shape), gy",
      "grouped LayerNorm: weight ×1.01"),
    M(FA + "grouped.py", "        return (gz * self.alpha, gbs * self.beta, ProductSum(gz, self.qk, self.alpha.shape),",
      "        return (gz * self.alpha, gbs * self.beta, ProductSum(gz, self.qk * 1.01, self.alpha.shape),",
      "grouped DirectionalLogits: α's gradient ×1.01"),
    M(FA + "grouped.py", "ProductSum(gbs, self.s, self.beta.shape), gbs)", "ProductSum(gbs, self.s, self.beta.shape), gbs * 0)",
      "grouped DirectionalLogits: γ's gradient dropped"),
    # --- ops/indexing.py, and the slices' gradients (fast/slices.py) -------------------------------------
    M(O + "indexing.py", "        return gy.transpose(tuple(np.argsort(self.axes)))", "        return gy.transpose(self.axes)",
      "Transpose: not inverted"),
    M(O + "indexing.py", "            gx[self.index] = gy           # slices", "            gx[self.index] = gy * 1.01  # slices",
      "getitem (slices, masks) ×1.01"),
    M(O + "indexing.py", "            k = k * size + xp.asarray(i) % size", "            k = k + xp.asarray(i) % size",
      "gather: row-major position wrong"),
    M(O + "indexing.py", "np.cumsum(self.sizes)[:-1].tolist()", "np.cumsum(self.sizes)[1:].tolist()", "Concat: split points"),
    M(O + "indexing.py", "        return tuple(gy.take(i, axis=self.axis) for i in range(n))",
      "        return tuple(gy.take(n - 1 - i, axis=self.axis) for i in range(n))", "Stack: reversed"),
    M(O + "indexing.py", "        return segment_sum(gy.reshape(1, -1, d), self.ids.reshape(-1), V)[0]",
      "        return segment_sum(gy.reshape(1, -1, d), self.ids.reshape(-1)[::-1], V)[0]", "Embedding: ids reversed"),
    M(FA + "slices.py", "            view += item.g", "            view += 1.01 * item.g", "annex Slices.total ×1.01"),
    M(FA + "slices.py", "        gx[items[0].index] = items[0].g\n", "        gx[items[0].index] = items[0].g * 1.01\n",
      "annex Slices.total: the first slice ×1.01"),
    M(FA + "slices.py", '"concatenate" if kinds.pop() else "stack", [span[3] for span in spans]',
      '"concatenate" if kinds.pop() else "stack", [span[3] for span in spans][::-1]',
      "annex Slices: tiles put side by side in the wrong order"),
    M(FA + "slices.py", "            return Slices(self.index, gy, self.shape)", "            return Slices(self.index, gy * 1.01, self.shape)",
      "annex SlicingGetItem ×1.01"),
    # --- ops/fused.py: each fused backward and its composed form ---------------------------------------
    M(O + "fused.py", "        return y * (gy - (gy * y).sum(axis=self.axis, keepdims=True))", "        return y * gy",
      "Softmax: term dropped"),
    M(O + "fused.py", "        return y * (gy - (gy * y).sum(axis=self.axis, keepdims=True))",
      "        return y * (gy - (gy * y).sum(axis=-1, keepdims=True))", "Softmax: sum over the last axis"),
    M(O + "fused.py", "    return e / E.where(s.data > 0, s, 1.0)", "    return e / E.where(s.data > 0, s.data, 1.0)",
      "composed softmax: the normaliser's term dropped"),
    M(O + "fused.py", "    s = R.sum(e, axis, keepdims=True)", "    s = R.sum(e, -1, keepdims=True)",
      "composed softmax: sum over the last axis"),
    M(O + "fused.py", "        return gy - xp.exp(self.y) * gy.sum(axis=self.axis, keepdims=True)",
      "        return gy - xp.exp(self.y) * gy.sum(axis=-1, keepdims=True)", "LogSoftmax: sum over the last axis"),
    M(O + "fused.py", "        return gy - xp.exp(self.y) * gy.sum(axis=self.axis, keepdims=True)",
      "        return gy - xp.exp(self.y) * gy", "LogSoftmax: no reduction"),
    M(O + "fused.py", "    return shifted - E.log(R.sum(E.exp(shifted), axis, keepdims=True))",
      "    return shifted - E.log(R.sum(E.exp(shifted), -1, keepdims=True))", "composed log_softmax: sum over the last axis"),
    M(O + "fused.py", "    return shifted - E.log(R.sum(E.exp(shifted), axis, keepdims=True))",
      "    return shifted - E.log(R.sum(E.exp(shifted), axis, keepdims=True).data)",
      "composed log_softmax: the log-sum-exp's term dropped"),
    M(O + "fused.py", "        return (p - self.onehot) * (self.weight * gy)[..., None]",
      "        return (p - self.onehot) * gy", "CrossEntropy: mean weights dropped"),
    M(O + "fused.py", "    return -R.sum(picked * weight)", "    return -R.sum(picked)", "composed cross-entropy: mean weights dropped"),
    M(O + "fused.py", "valid.astype(dtype) / xp.maximum(valid.sum(), 1).astype(dtype)", "valid.astype(dtype)",
      "cross-entropy (both forms): a sum over targets, not the mean"),
    M(O + "fused.py", "        return self.grad_x(gy), gy * self.xhat, gy", "        return self.grad_x(gy), gy * self.xhat * 1.01, gy",
      "LayerNorm: weight ×1.01"),
    M(O + "fused.py", "        xhat, gh = self.xhat, gy * self.weight\n", "        xhat, gh = self.xhat, gy\n",
      "LayerNorm: input grad without weight"),
    M(O + "fused.py", "gh - gh.mean(axis=-1, keepdims=True) - xhat * (gh * xhat).mean(axis=-1, keepdims=True)",
      "gh - gh.mean(axis=-1, keepdims=True)", "LayerNorm: variance term dropped"),
    M(O + "fused.py", "    return xc / E.sqrt(var + eps) * weight + bias", "    return xc / E.sqrt(var.data + eps) * weight + bias",
      "composed layer norm: variance term dropped"),
    M(O + "fused.py", "    xc = x - R.mean(x, -1, keepdims=True)", "    xc = x - R.mean(x, -1, keepdims=True).data",
      "composed layer norm: mean term dropped"),
    # --- nn blocks ---------------------------------------------------------------------------------------
    M("minattn/nn.py", "        return n + z * (h - n)", "        return h + z * (n - h)", "GRU: z gates n"),
    M("minattn/nn.py", "n = F.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])", "n = F.tanh(r * gi[:, 2 * H:] + gh[:, 2 * H:])",
      "GRU: reset gate on the input"),
    M("minattn/nn.py", "r, z = rz[:, :H], rz[:, H:]", "z, r = rz[:, :H], rz[:, H:]", "GRU: r and z swapped"),
    M("minattn/nn.py", "        c = f * c + i * g", "        c = i * c + f * g", "LSTM: i and f swapped"),
    M("minattn/nn.py", "        return o * F.tanh(c), c", "        return o * c, c", "LSTM: no tanh on c'"),
    M("minattn/nn.py", "g = F.tanh(gates[:, 2 * H:3 * H])", "g = F.sigmoid(gates[:, 2 * H:3 * H])", "LSTM: σ for tanh"),
    M("minattn/nn.py", "        self.eps = eps", "        self.eps = 1e-5", "LayerNorm ε ignored"),
    M("minattn/nn.py", "return keep * dtype.type(1 / (1 - self.p)) if self.scale",
      "return keep * dtype.type(1 - self.p) if self.scale", "Dropout scales by 1 − p"),
    M("minattn/nn.py", "        if not (self.training and is_training()) or self.p == 0:",
      "        if not self.training or self.p == 0:", "Dropout ignores eval_mode()"),
    M("minattn/nn.py", "        return self.masks[self.used - 1]", "        return self.masks[0]",
      "a shared layer's dropouts: one mask for all n applications"),
    M("minattn/nn.py", "freq = 10000.0 ** (-np.arange(0, d, 2) / d)", "freq = 1000.0 ** (-np.arange(0, d, 2) / d)",
      "PE base 1000"),
    M("minattn/nn.py", "        pe[:, 0::2] = np.sin(angle)", "        pe[:, 0::2] = np.cos(angle)", "PE: cos on even"),
    M("minattn/nn.py", "np.concatenate([np.sin(angle), np.cos(angle)], axis=1)",
      "np.concatenate([np.cos(angle), np.sin(angle)], axis=1)", "PE concat: cos first"),
    M("minattn/nn.py", "        return self.fc2(self.dropout(F.relu(self.fc1(x))))", "        return self.fc2(self.dropout(F.tanh(self.fc1(x))))",
      "FFN: tanh for ReLU"),
    # --- annex: fast/shared_layer.py -------------------------------------------------------------------
    M(FA + "shared_layer.py", "            del m._once", "            pass",
      "annex shared layer: the cache outlives its pass (stale derived weights)"),
    # --- optimizers (one parameter at a time; the flat buffer of fast/flat.py calls the same update) ------
    M("minattn/optim.py", "        m += (1 - b1) * g", "        m += b1 * g", "Adam: m update"),
    M("minattn/optim.py", "        v += (1 - b2) * (g * g)", "        v += (1 - b2) * g", "Adam: v of g, not g²"),
    M("minattn/optim.py", "bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t", "bc1, bc2 = 1.0, 1 - b2 ** self.t",
      "Adam: no bias correction of m"),
    M("minattn/optim.py", "        denom *= 1 / math.sqrt(bc2)", "        denom *= 1 / bc2", "Adam: v̂ correction not square-rooted"),
    M("minattn/optim.py", "                g = g + self.weight_decay * p.data", "                g = g - self.weight_decay * p.data",
      "Adam: L2 sign"),
    M("minattn/optim.py", "p.data -= (self.lr * self.weight_decay) * p.data", "p.data -= self.weight_decay * p.data",
      "AdamW: decay without lr"),
    M("minattn/optim.py", "                s[\"v\"] *= self.momentum", "                s[\"v\"] *= 1.0", "SGD: momentum ignored"),
    M("minattn/optim.py", "        p.data -= self.lr * g\n", "        p.data += self.lr * g\n", "SGD: ascent"),
    M("minattn/optim.py", "            if p.grad is not None:\n                self.update(p, p.grad, s)",
      "            if p.grad is not None:\n                self.update(p, p.grad, s)\n                break",
      "optimizer: only the first parameter updated"),
    M("minattn/optim.py", "scale = max_norm / xp.maximum(norm + 1e-6, max_norm)", "scale = max_norm / (norm + 1e-6)",
      "clipping scales up small gradients"),
    M("minattn/optim.py", "norm = xp.sqrt(sum((g * g).sum() for g in grads))", "norm = sum((g * g).sum() for g in grads)",
      "clipping by the squared norm"),
    # --- annex: fast/flat.py (the flat buffer, its AdamW/SGD step and clipping) --------------------------
    M(FA + "flat.py", "    g *= max_norm / xp.maximum(norm + 1e-6, max_norm)", "    g *= max_norm / (norm + 1e-6)",
      "flat clipping scales up small gradients"),
    M(FA + "flat.py", "    norm = xp.sqrt(g.dot(g))", "    norm = g.dot(g)", "flat clipping by the squared norm"),
    M(FA + "flat.py", "concatenate([g.reshape(-1) for g in grads])", "concatenate([g.reshape(-1) for g in grads[::-1]])",
      "flat gradients: parameters in the wrong order"),
    M(FA + "flat.py", "    elif opt.state is not flat.split_of:      # load_state_dict replaced the state",
      "    elif False:", "flat: a loaded optimizer state ignored"),
    M(FA + "flat.py", "        Optimizer.update_each(opt)\n        return flat.join_state(opt)",
      "        Optimizer.update_each(opt)\n        return", "flat: a step with a missing gradient loses the others' state"),
    M(FA + "flat.py", "    if not FlatParameters.possible(opt.params):\n        return Optimizer.update_each(opt)",
      "    if not FlatParameters.possible(opt.params):\n        return", "annex optimizer: no update on NumPy"),
]

# (description: why no test can kill it). They are planted like the others (so a real kill is noticed) but
# not counted in the score.
EQUIVALENT = {
    "(equivalent) keep checking after a failure":
        "the checker reports the first failing direction of a tensor and stops; checking the others too adds "
        "lines to the message, never turns a failure into a pass",
}


def copy_tree(dst):
    """The working tree (tracked and untracked, not ignored files) into dst."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, f))


def run_tests(tree, tests, timeout):
    env = dict(os.environ, PYTHONPATH=tree, MINATTN_REQUIRE_GPU="0", OPENBLAS_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("MINATTN_UPDATE_GOLDEN", None)
    env.pop("MINATTN_REGEN_GOLDEN", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu",
           "--ignore=tests/test_golden.py"] + tests
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", ""
    out = r.stdout.decode(errors="replace")
    failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if r.returncode == 0:
        return "survived", ""
    if r.returncode == 1:
        return "killed", failed[0] if failed else ""
    return "error", out[-2000:] + r.stderr.decode(errors="replace")[-2000:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="mutants whose file or description contains this text")
    ap.add_argument("--section", choices=["definitions", "core", "all"], default="all")
    ap.add_argument("--no-golden", action="store_true", help="skip the golden-snapshot pass over survivors")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mutant run")
    args = ap.parse_args(argv)
    catalogue = ([("definitions", m) for m in DEFINITIONS] if args.section != "core" else []) + \
                ([("core", m) for m in CORE] if args.section != "definitions" else [])
    if args.only:
        catalogue = [(s, m) for s, m in catalogue if args.only in m.file or args.only in m.description]
    if args.list:
        for s, m in catalogue:
            print(f"[{s}] {m.file}: {m.description}")
        return 0
    start = time.time()
    results, errors = [], []
    with tempfile.TemporaryDirectory(prefix="minattn-mutation-") as tree:
        copy_tree(tree)
        # the copy, not the editable install, must be what the tests import
        where = subprocess.run([sys.executable, "-c", "import minattn; print(minattn.__file__)"], cwd=tree,
                               env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True).stdout.strip()
        if not where.startswith(tree):
            print(f"ERROR: the copy imports minattn from {where}, not from {tree}")
            return 2
        baseline = {}
        for i, (section, m) in enumerate(catalogue, 1):
            path = os.path.join(tree, m.file)
            with open(path, encoding="utf-8") as f:
                original = f.read()
            n = original.count(m.original)
            if n != 1:
                errors.append((m, f"anchor found {n} times"))
                print(f"[{i}/{len(catalogue)}] ERROR {m.file}: {m.description}: anchor found {n} times")
                continue
            tests = tests_for(m.file)
            key = tuple(tests)
            if key not in baseline:                      # the unmutated tree must pass these tests
                baseline[key] = run_tests(tree, tests, args.timeout)[0]
                if baseline[key] != "survived":
                    print(f"ERROR: the unmutated tree fails {' '.join(tests)}")
                    return 2
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(m.original, m.replacement))
            try:
                t0 = time.time()
                status, detail = run_tests(tree, tests, args.timeout)
                golden = None
                if status == "survived" and not args.no_golden:
                    golden = _golden(tree, args.timeout)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            results.append((section, m, status, golden))
            note = f" (golden: {golden})" if golden else ""
            print(f"[{i}/{len(catalogue)}] {status:8s} {time.time() - t0:5.1f}s {m.file}: {m.description}{note}"
                  + (f"  <- {detail}" if status == "killed" and detail else "")
                  + (f"\n{detail}" if status == "error" else ""), flush=True)
    counted = [r for r in results if r[1].description not in EQUIVALENT]
    killed = [r for r in counted if r[2] in ("killed", "timeout", "error")]
    by_golden = [r for r in counted if r[2] == "survived" and r[3] == "killed"]
    survivors = [r for r in counted if r[2] == "survived"]
    print("\n=== mutation score ===")
    for section in ("definitions", "core"):
        sec = [r for r in counted if r[0] == section]
        if sec:
            k = sum(r[2] != "survived" for r in sec)
            print(f"{section:12s}: {k}/{len(sec)} killed without the golden snapshot ({100 * k / len(sec):.1f}%)")
    if counted:
        print(f"all         : {len(killed)}/{len(counted)} killed without the golden snapshot "
              f"({100 * len(killed) / len(counted):.1f}%)")
        if not args.no_golden:
            k2 = len(killed) + len(by_golden)
            print(f"all         : {k2}/{len(counted)} killed with it ({100 * k2 / len(counted):.1f}%)")
    for r in survivors:
        print(f"SURVIVED: {r[1].file}: {r[1].description}" + (f" (golden: {r[3]})" if r[3] else ""))
    for r in results:
        if r[1].description in EQUIVALENT:
            print(f"equivalent ({r[2]}): {r[1].description}: {EQUIVALENT[r[1].description]}")
    for m, why in errors:
        print(f"ERROR (anchor): {m.file}: {m.description}: {why}")
    print(f"{len(results)} mutants run in {time.time() - start:.0f} s; {len(errors)} anchor errors")
    return 1 if errors else 0


def _golden(tree, timeout):
    env = dict(os.environ, PYTHONPATH=tree, OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("MINATTN_UPDATE_GOLDEN", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "tests/test_golden.py"]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if r.returncode == 0 else "killed"


if __name__ == "__main__":
    sys.exit(main())
