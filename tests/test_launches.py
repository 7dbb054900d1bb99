"""Launches per training step (tests/counting.py): the counting device's rules, the NDR step's budget,
and the flat optimizer buffer that most of the cut came from."""
import numpy as np
import pytest

from minattn import backend, nn, optim
from minattn.engine import Tensor

from . import counting
from .counting import COUNTER, count_step

# Launches of one NDR training step on CTL at train.py's cpu preset (forward + backward + clipping +
# AdamW). Issue 19 measured ~4,000 (this counter: 3,632); a GPU pays ~10–15 µs of host time per launch.
NDR_CTL_BUDGET = 2300


def _counted(fn):
    COUNTER.reset()
    fn()
    return sum(COUNTER.launches.values()), sum(COUNTER.syncs.values())


def test_counting_rules_follow_cupy():
    x = backend.to_device(np.arange(12.0).reshape(3, 4), "counting")
    assert _counted(lambda: (x.reshape(4, 3), x.T, x.swapaxes(0, 1), x[1:], x[None])) == (0, 0)   # views
    assert _counted(lambda: x.T.reshape(-1)) == (1, 0)                         # a reshape that copies
    assert _counted(lambda: (x + 1, x.sum(axis=0), x @ x.T, np.exp(x))) == (4, 0)
    with pytest.raises(counting.HostConversionError):
        x + np.ones(4)                                                         # host data mixed in
    assert _counted(lambda: (float(x[0, 0]), x.sum().item(), backend.to_numpy(x)))[1] == 3
    idx = backend.to_device(np.array([0, 2]), "counting")
    assert _counted(lambda: x[idx]) == (1, 0)                                  # a gather kernel
    assert _counted(lambda: x[x > 3]) == (2, 1)                                # size known only on the host


def test_ndr_ctl_step_stays_within_its_launch_budget_without_host_syncs():
    model, loss_fn, opt, clip, rng = counting.ndr_ctl_step("ndr")
    launches, syncs = count_step(model, loss_fn, opt, clip, rng)
    assert sum(syncs.values()) == 0, syncs
    assert sum(launches.values()) <= NDR_CTL_BUDGET, launches
    assert launches["optimizer"] <= 20 and launches["clipping"] <= 10, launches


def _params(seed, shapes=((3, 2), (4,), (1,))):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(rng.standard_normal(s).astype(np.float32)) for s in shapes]


@pytest.mark.parametrize("cls,kw", [(optim.AdamW, dict(lr=0.01, weight_decay=0.1)), (optim.Adam, dict(lr=0.01)),
                                    (optim.SGD, dict(lr=0.1, momentum=0.9))])
def test_flat_update_gives_the_bits_of_one_parameter_at_a_time(cls, kw):
    """The flat buffer changes only how many array operations a step takes, not its arithmetic."""
    flat, single = _params(0), _params(0)
    opt_flat = cls(flat, **kw)
    opt_single = [cls([p], **kw) for p in single]             # one parameter each: the same per-element math
    rng = np.random.default_rng(1)
    for _ in range(3):
        for p, q in zip(flat, single):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad, q.grad = g.copy(), g.copy()
        opt_flat.step()
        for o in opt_single:
            o.step()
    assert opt_flat.flat is not None and opt_flat.flat.intact()
    for p, q in zip(flat, single):
        np.testing.assert_array_equal(p.data, q.data)


def test_parameters_are_views_of_the_flat_buffer_and_state_dicts_keep_their_form():
    params = _params(0)
    opt = optim.AdamW(params, lr=0.01)
    for p in params:
        p.grad = np.ones(p.shape, np.float32)
    opt.step()
    opt.flat.data[:] = 7
    assert all((p.data == 7).all() for p in params)          # views: one update moves them all
    sd = opt.state_dict()
    assert [sorted(s) for s in sd["state"]] == [["m", "v"]] * 3
    assert [s["m"].shape for s in sd["state"]] == [p.shape for p in params]
    # Replacing p.data (load_state_dict, Module.to) breaks the view: the next step builds a new buffer.
    params[1].data = np.full(4, 2.0, np.float32)
    opt.load_state_dict(sd)
    for p in params:
        p.grad = np.zeros(p.shape, np.float32)
    opt.step()
    assert opt.flat.intact() and (params[1].data < 2).all()


def test_clip_grad_norm_over_the_flat_buffer_matches_one_by_one():
    params = _params(0)
    opt = optim.SGD(params, lr=0.0)
    for p in params:
        p.grad = np.ones(p.shape, np.float32)
    opt.step()                                                # builds the flat buffer
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(p.shape).astype(np.float32) * 3 for p in params]
    for p, g in zip(params, grads):
        p.grad = g.copy()
    norm = optim.clip_grad_norm(params, 1.0)
    assert params[0].grad.base is not None                     # now a view of the flat gradient
    expected = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
    assert float(norm) == pytest.approx(expected, rel=1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad, g / expected, rtol=1e-5)
    flat_grads = [p.grad.copy() for p in params]
    opt.step()                                                 # uses the clipped flat gradient as it is
    assert all(np.array_equal(p.grad, g) for p, g in zip(params, flat_grads))


def test_tensor_grad_of_a_leaf_is_never_shared_after_summing():
    """Several gradients of one tensor are summed once, into an array of its own."""
    a = Tensor(np.ones(3, np.float32), requires_grad=True)
    b = Tensor(np.ones(3, np.float32), requires_grad=True)
    y = (a + b) + (a + b) + a + b
    y.backward(np.ones(3, np.float32))
    assert a.grad is not b.grad
    np.testing.assert_array_equal(a.grad, [3, 3, 3])
    np.testing.assert_array_equal(b.grad, [3, 3, 3])
