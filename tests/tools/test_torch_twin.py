"""minattn.tools.torch_twin (the NDR classifier in PyTorch, for timing) computes what minattn's does: same logits
and same gradients from the same weights. torch is not a dependency: this runs where torch is installed
(the GPU machines), and is skipped elsewhere."""
import numpy as np
import pytest

from minattn import functional as F
from minattn.models.encoder import Classifier, EncoderConfig

torch = pytest.importorskip("torch")
from minattn.tools.torch_twin import TorchNDR  # noqa: E402


def test_twin_matches_minattn_ndr():
    cfg = EncoderConfig(d_model=32, d_ff=48, n_head=2, n_steps=3, dropout=0.0, attention_dropout=0.0,
                        gate_dropout=0.0)
    model = Classifier("ndr", 19, 8, cfg, seed=3)
    twin = TorchNDR(model).double()
    rng = np.random.default_rng(0)
    lengths = np.array([7, 5, 8, 4])                       # padded batch: keys past each length are masked
    ids = rng.integers(0, 19, (4, 8))
    y = rng.integers(0, 8, 4)

    logits = model(ids, lengths)
    F.cross_entropy(logits, y).backward()
    t_logits = twin(torch.as_tensor(ids), torch.as_tensor(lengths))
    t_loss = torch.nn.functional.cross_entropy(t_logits, torch.as_tensor(y))
    t_loss.backward()
    np.testing.assert_allclose(logits.data, t_logits.detach().numpy(), rtol=1e-4, atol=1e-5)

    layer, att = model.encoder.layer, model.encoder.layer.attn
    pairs = {"embedding": model.encoder.embedding.weight.grad, "w_qkv": att.w_qkv.grad,
             "b_q": att.b_q.grad.reshape(-1), "w_s": att.direction.weight.grad, "w_o": att.w_o.grad,
             "alpha": att.alpha.grad, "beta": att.beta.grad, "gamma": att.gamma.grad,
             "w1": np.concatenate([layer.ff.fc1.weight.grad, layer.gate.fc1.weight.grad], 1),
             "w2": layer.ff.fc2.weight.grad, "wg": layer.gate.fc2.weight.grad, "w_head": model.head.weight.grad}
    for name, grad in pairs.items():
        np.testing.assert_allclose(grad, getattr(twin, name).grad.numpy(), rtol=2e-3, atol=1e-5, err_msg=name)
