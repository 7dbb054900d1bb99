"""Device purity: cupy lives in backend.py alone, and nothing converts device data implicitly."""
import pathlib
import re

import numpy as np
import pytest

from minattn import backend
from minattn.engine import Tensor

from .strict import HostConversionError, StrictArray

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_cupy_is_imported_only_in_backend():
    pattern = re.compile(r"^\s*(import cupy|from cupy)", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.glob("**/*.py")
                 if ".venv" not in p.parts and pattern.search(p.read_text()) and p.name != "backend.py"]
    assert offenders == []
    assert pattern.search((ROOT / "minattn" / "backend.py").read_text())


def test_strict_array_refuses_implicit_host_conversion():
    x = backend.to_device(np.arange(3.0), "strict")
    assert isinstance(x, StrictArray) and isinstance(x + 1, StrictArray)
    for convert in (np.asarray, float, lambda a: a.item(), lambda a: a.sum().item(), bool,
                    lambda a: a + np.ones(3)):
        with pytest.raises(HostConversionError):
            convert(x)
    np.testing.assert_array_equal(backend.to_numpy(x * 2), [0, 2, 4])   # the explicit way out


def test_rng_draws_on_its_device_and_forks_reproducibly(device):
    a = backend.RNG(3, device).fork(1).uniform((4,))
    b = backend.RNG(3, device).fork(1).uniform((4,))
    c = backend.RNG(3, device).fork(2).uniform((4,))
    assert backend.device_of(a) == device and a.dtype == np.float32
    np.testing.assert_array_equal(backend.to_numpy(a), backend.to_numpy(b))
    assert not np.array_equal(backend.to_numpy(a), backend.to_numpy(c))


def test_tensor_defaults_to_float32():
    assert Tensor([1.0, 2.0]).dtype == np.float32
    assert Tensor(np.zeros(2)).dtype == np.float64       # explicit arrays keep their dtype
    with pytest.raises(TypeError, match="floating"):
        Tensor(np.arange(3), requires_grad=True)
