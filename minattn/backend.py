"""The array backend: NumPy on CPU, CuPy on CUDA GPUs.

This is the ONLY module of minattn that imports cupy. Everything else asks it for the array
module of some data (``array_module(x)``) and writes ``xp.exp(x)``, so the same code runs on both
devices. Devices are named "cpu" and "gpu"; tests may register extra ones (see
``tests/strict.py``, a device whose arrays refuse implicit host conversion, as CuPy's do).

Randomness is explicit: an ``RNG`` draws on the device of the data it makes, from a seed, and can be
forked into independent streams (one per step, one per module) so runs are reproducible and
resumable without saving device RNG state.
"""
import os

import numpy as np

DEFAULT_DTYPE = np.float32

GPU_HINT = ("install the CuPy wheel matching your CUDA driver: pip install cupy-cuda12x "
            "(CUDA 12) or cupy-cuda13x (CUDA 13)")


class DeviceError(RuntimeError):
    """A device was asked for that this machine cannot provide (unknown name, no CuPy, no GPU)."""


# device name -> array module, and array type -> device name; filled lazily for "gpu".
_XP = {"cpu": np}
ARRAY_TYPES = _DEVICE_OF_TYPE = {np.ndarray: "cpu"}


def register_device(name, xp, array_type):
    """Make ``name`` a device whose arrays are ``array_type`` created by module ``xp``."""
    _XP[name] = xp
    _DEVICE_OF_TYPE[array_type] = name


def _load_cupy():
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken install that fails while importing
        raise DeviceError(f"device 'gpu' needs CuPy, which could not be imported ({e.__class__.__name__}); "
                          f"{GPU_HINT}") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise DeviceError(f"device 'gpu': CuPy found no usable CUDA GPU ({e}); {GPU_HINT}") from None
    if n < 1:
        raise DeviceError(f"device 'gpu': CuPy found no CUDA GPU; {GPU_HINT}")
    register_device("gpu", cupy, cupy.ndarray)
    return cupy


def get_xp(device):
    """The array module of a device name ("cpu", "gpu", or a registered test device)."""
    xp = _XP.get(device)
    if xp is None:
        if device == "gpu":
            return _load_cupy()
        raise DeviceError(f"unknown device {device!r}; valid devices: cpu, gpu")
    return xp


def gpu_available():
    """True when CuPy imports and sees at least one GPU (never raises)."""
    try:
        get_xp("gpu")
        return True
    except DeviceError:
        return False


def device_of(x):
    """Device name of an array (Python/NumPy scalars count as "cpu")."""
    return _DEVICE_OF_TYPE.get(type(x), "cpu")


def array_module(x):
    """The array module (numpy, cupy, ...) that ``x`` lives in."""
    if type(x) is np.ndarray:  # fast path: this runs once per op
        return np
    return _XP[device_of(x)]


def to_device(x, device, dtype=None):
    """Copy ``x`` (array or nested lists) to ``device``; a no-op when it is already there."""
    if device_of(x) == device and not isinstance(x, (list, tuple, int, float)):
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    xp = get_xp(device)
    return xp.asarray(to_numpy(x), dtype=dtype)


def to_numpy(x):
    """Explicit device-to-host copy (the one place the library moves data to the host)."""
    if isinstance(x, np.ndarray) or np.isscalar(x) or isinstance(x, (list, tuple)):
        return np.asarray(x)
    get = getattr(x, "get", None)  # cupy.ndarray.get() and the strict test array
    if get is None:
        raise TypeError(f"cannot move {type(x).__name__} to the host")
    return get()


class RNG:
    """A seeded random stream that draws on one device.

    ``fork(*keys)`` returns an independent stream determined by (seed, keys): the training loop
    forks one per step, so resuming at step k replays exactly the same masks and noise.
    """

    def __init__(self, seed=0, device="cpu", keys=()):
        self.seed, self.device, self.keys = int(seed), device, tuple(int(k) for k in keys)
        entropy = [self.seed, *self.keys]
        xp = get_xp(device)
        if xp is np:
            self._gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        else:  # CuPy and test devices: seed the device generator from the same SeedSequence
            seed32 = int(np.random.SeedSequence(entropy).generate_state(1)[0])
            self._gen = xp.random.RandomState(seed32)

    def fork(self, *keys):
        return RNG(self.seed, self.device, self.keys + keys)

    def uniform(self, shape, dtype=None):
        """Uniform samples in [0, 1)."""
        dtype = dtype or DEFAULT_DTYPE
        if isinstance(self._gen, np.random.Generator):
            return self._gen.random(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
        return self._gen.random_sample(shape, dtype=dtype)

    def keep_mask(self, shape, p_drop):
        """Boolean mask, each entry True with probability 1 − p_drop (dropout's "keep" mask).

        On NumPy it compares 16-bit random integers with round(p_drop · 65536), about twice as fast as
        float uniforms; p_drop is thereby rounded to a multiple of 1/65536."""
        if isinstance(self._gen, np.random.Generator):
            return self._gen.integers(0, 65536, size=shape, dtype=np.uint16) >= round(p_drop * 65536)
        return self._gen.random_sample(shape, dtype=np.float32) >= p_drop

    def normal(self, shape, dtype=None):
        dtype = dtype or DEFAULT_DTYPE
        if isinstance(self._gen, np.random.Generator):
            return self._gen.standard_normal(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
        return self._gen.standard_normal(shape, dtype=dtype)

    def gumbel(self, shape, dtype=None):
        """Standard Gumbel noise -log(-log U), with U kept away from 0 and 1 so it is finite."""
        u = self.uniform(shape, dtype)
        xp = array_module(u)
        tiny = float(np.finfo(u.dtype).tiny)
        return -xp.log(-xp.log(xp.clip(u, tiny, 1.0 - float(np.finfo(u.dtype).epsneg))))



def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS.

    By default glibc serves large blocks with mmap and unmaps them on free, so every big temporary
    array of every step pays fresh page faults (kernel time zeroing pages). Raising the mmap and trim
    thresholds keeps them in the heap: on this project's 2-core machines an NDR step made ~2.5× fewer
    page faults (system time 0.62 s → 0.25 s over 9 steps) and a small CRT step ran up to ~2× faster.
    Process-wide, so only the command-line tools call it; set MINATTN_KEEP_MEMORY=0 to skip it.
    Returns True when the setting took effect (Linux with glibc), else False.
    """
    if os.environ.get("MINATTN_KEEP_MEMORY", "1") == "0":
        return False
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
