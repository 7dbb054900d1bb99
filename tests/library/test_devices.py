"""Device purity: cupy lives in backend.py alone, and nothing converts device data implicitly."""
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from minattn import backend
from minattn.engine import Tensor

from minattn.tools.strict import HostConversionError, StrictArray

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


def test_reseed_gives_the_stream_of_a_new_rng_and_keeps_its_generator(device):
    rng = backend.RNG(3, device)
    gen = rng._gen
    for k in (1, 2, 1):
        got = rng.reseed(k).uniform((5,))
        np.testing.assert_array_equal(backend.to_numpy(got), backend.to_numpy(backend.RNG(3, device, (k,)).uniform((5,))))
    if device != "cpu":                  # a device generator is made once; NumPy's host PCG64 is rebuilt
        assert rng._gen is gen


# --- CuPy validation: a fake cupy module fails the way CuPy 14 does on a broken machine ------------------

class _CudaError(RuntimeError):
    """Stands in for cupy_backends' CUDARuntimeError / CUDADriverError (RuntimeError subclasses)."""


def _raise(exc):
    def f(*a, **k):
        raise exc
    return f


def _fake_cupy(**broken):
    """A NumPy-backed module with the few names the self-test uses; ``broken`` replaces some of them."""
    cupy = types.SimpleNamespace(
        asarray=np.asarray, asnumpy=np.asarray, multiply=np.multiply, matmul=np.matmul, ndarray=_FakeArray,
        random=types.SimpleNamespace(RandomState=_FakeRandomState),
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1)))
    for name, value in broken.items():
        if name == "getDeviceCount":
            cupy.cuda.runtime.getDeviceCount = value
        elif name == "RandomState":
            cupy.random.RandomState = value
        else:
            setattr(cupy, name, value)
    return cupy


class _FakeArray:
    pass


class _FakeRandomState:
    def __init__(self, seed):
        self._rs = np.random.RandomState(seed)

    def random_sample(self, size, dtype):
        return self._rs.random_sample(size).astype(dtype)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Install a fake CuPy in backend's loader; backend forgets the real "gpu" device for the test."""
    monkeypatch.setattr(backend, "_gpu_error", None)
    monkeypatch.setattr(backend, "_XP", {k: v for k, v in backend._XP.items() if k != "gpu"})  # restored after
    monkeypatch.setattr(backend, "_DEVICE_OF_TYPE", dict(backend._DEVICE_OF_TYPE))
    monkeypatch.setattr(backend, "_cupy_wheel", lambda: "cupy-cuda13x")

    def install(cupy=None, error=None):
        monkeypatch.setattr(backend, "_import_cupy", _raise(error) if error else lambda: cupy)
    return install


MISSING = 'Failure finding "{}": No such file: {}, No such file: {}\n'
FAILURES = [
    # (what breaks, how CuPy 14 reports it, words the one-line error must contain)
    ("not installed", dict(error=ModuleNotFoundError("No module named 'cupy'")),
     ["could not be imported", "cupy-cuda12x[ctk]", "cupy-cuda13x[ctk]"]),
    ("no GPU", dict(getDeviceCount=_raise(_CudaError("cudaErrorNoDevice: no CUDA-capable device is detected"))),
     ["no CUDA GPU", "nvidia-smi", "CUDA_VISIBLE_DEVICES"]),
    ("zero GPUs", dict(getDeviceCount=lambda: 0), ["no CUDA GPU"]),
    ("driver too old", dict(getDeviceCount=_raise(_CudaError(
        "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"))),
     ["driver is missing or older", "cupy-cuda13x", "CUPY=cupy-cuda12x"]),
    ("no NVRTC", dict(multiply=_raise(RuntimeError(MISSING.format(*["libnvrtc.so.13 or libnvrtc.so.12"] * 3)))),
     ["elementwise kernel", "libnvrtc", 'pip install "cupy-cuda13x[ctk]"']),
    ("no cuBLAS", dict(matmul=_raise(ImportError(MISSING.format(*["libcublasLt.so.13 or libcublasLt.so.12"] * 3)))),
     ["matmul", "libcublasLt", 'pip install "cupy-cuda13x[ctk]"']),
    ("no cuRAND", dict(RandomState=_raise(ImportError(MISSING.format(*["libcurand.so.11 or libcurand.so.10"] * 3)))),
     ["random draw", "libcurand", 'pip install "cupy-cuda13x[ctk]"']),
    ("PTX newer than the driver", dict(multiply=_raise(_CudaError(
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an unsupported toolchain."))),
     ["driver is missing or older", "elementwise kernel"]),
    ("wrong numbers", dict(matmul=lambda a, b: np.zeros((2, 2), np.float32)), ["matmul", "gave wrong results"]),
    ("anything else", dict(asarray=_raise(_CudaError("cudaErrorMemoryAllocation: out of memory"))),
     ["copying an array to the GPU failed", "out of memory", "cupy-cuda12x[ctk]"]),
]


@pytest.mark.parametrize("case,setup,words", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_broken_cupy_is_one_line_naming_the_fix(fake_gpu, case, setup, words):
    error = setup.pop("error", None)
    fake_gpu(cupy=None if error else _fake_cupy(**setup), error=error)
    with pytest.raises(backend.DeviceError) as e:
        backend.get_xp("gpu")
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message
    assert not backend.gpu_available() and "gpu" not in backend._XP


def test_a_working_cupy_is_validated_once(fake_gpu):
    calls = []
    cupy = _fake_cupy(matmul=lambda a, b: calls.append(1) or a @ b)
    fake_gpu(cupy=cupy)
    assert backend.get_xp("gpu") is cupy and backend.get_xp("gpu") is cupy and backend.gpu_available()
    assert calls == [1]


def test_a_failed_validation_is_not_retried(fake_gpu):
    calls = []
    fake_gpu(cupy=_fake_cupy(getDeviceCount=lambda: calls.append(1) or 0))
    for _ in range(3):
        assert not backend.gpu_available()
    assert calls == [1]


@pytest.mark.parametrize("command", [["train.py", "--steps", "1"], ["-m", "minattn.tools.bench", "--only", "engine"]])
def test_train_and_bench_exit_2_with_one_line_when_cuda_libraries_are_missing(command, tmp_path):
    """The real command lines, in a subprocess whose cupy is a fake that lacks cuRAND (sitecustomize)."""
    fake = tmp_path / "cupy"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import numpy as np\n"
        "class ndarray: pass\n"
        "asarray = asnumpy = np.asarray\nmultiply, matmul = np.multiply, np.matmul\n"
        "class cuda:\n    class runtime:\n        getDeviceCount = staticmethod(lambda: 1)\n"
        "class random:\n    class RandomState:\n        def __init__(self, seed):\n"
        "            raise ImportError('Failure finding \"libcurand.so.11 or libcurand.so.10\": No such file')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    p = subprocess.run([sys.executable, *command, "--device", "gpu", *(["--out", str(tmp_path / "run")]
                        if command[0] == "train.py" else [])], cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "libcurand" in p.stderr and "[ctk]" in p.stderr, p.stderr


def test_no_float_atomics_in_the_library():
    """add.at / scatter_add use float atomics on a GPU: results would change from run to run. (The task
    generators in minattn/data/ run on the host with NumPy integers, where add.at is exact.)"""
    pattern = re.compile(r"\.add\.at\(|scatter_add")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "minattn").glob("**/*.py")
                 if pattern.search(p.read_text()) and p.parent.name != "data"]
    assert offenders == []
