"""The array backend: NumPy on CPU, CuPy on CUDA GPUs.

This is the ONLY module of minattn that imports cupy. Everything else asks it for the array
module of some data (``array_module(x)``) and writes ``xp.exp(x)``, so the same code runs on both
devices. Devices are named "cpu" and "gpu"; tests may register extra ones (see
``minattn/tools/strict.py``, a device whose arrays refuse implicit host conversion, as CuPy's do).

Randomness is explicit: an ``RNG`` draws on the device of the data it makes, from a seed, and can be
forked into independent streams (one per module) or reseeded in place (one stream per training step,
one generator per run) so runs are reproducible and resumable without saving device RNG state.
"""
import math
import os
import re
import sys

import numpy as np

DEFAULT_DTYPE = np.float32

GPU_HINT = ('install CuPy with its CUDA libraries, matching the CUDA version nvidia-smi shows: '
            'pip install "cupy-cuda12x[ctk]" (CUDA 12) or "cupy-cuda13x[ctk]" (CUDA 13); '
            'make venv DEVICE=gpu [CUPY=cupy-cuda13x] does it')


class DeviceError(RuntimeError):
    """A device was asked for that this machine cannot provide (unknown name, no CuPy, no GPU)."""


# device name -> array module, and array type -> device name; filled lazily for "gpu".
_XP = {"cpu": np}
ARRAY_TYPES = _DEVICE_OF_TYPE = {np.ndarray: "cpu"}


def register_device(name, xp, array_type):
    """Make ``name`` a device whose arrays are ``array_type`` created by module ``xp``."""
    _XP[name] = xp
    _DEVICE_OF_TYPE[array_type] = name


def _import_cupy():
    """The one import of CuPy (tests replace this function with fakes that fail as CuPy does)."""
    import cupy
    return cupy


def _cupy_wheel():
    """The installed CuPy wheel's name, so a hint can name the exact package to fix."""
    from importlib import metadata
    for name in ("cupy-cuda12x", "cupy-cuda13x"):
        try:
            metadata.version(name)
            return name
        except metadata.PackageNotFoundError:
            pass
    return "cupy-cuda12x"


def _gpu_failure(what, e):
    """One line saying what failed and how to fix it, from the exception CuPy raised.

    CuPy 14 loads NVRTC, cuBLAS and cuRAND only when first used, so a wheel installed without its
    ``[ctk]`` extra on a driver-only machine imports fine and fails at the first kernel, matmul or
    random draw: the self-test runs each once so that this happens here, not mid-training."""
    text = " ".join(str(e).split())
    wheel = _cupy_wheel()
    lib = re.search(r"lib(nvrtc|cublas|curand|cudart)\w*", text)
    if lib:
        return (f"device 'gpu': {what} failed because CuPy cannot find {lib.group(0)}, a CUDA "
                f"library that {wheel} installs only with its CUDA toolkit extra: pip install "
                f"\"{wheel}[ctk]\"")
    if re.search(r"InsufficientDriver|driver version is "
                 r"insufficient|UNSUPPORTED_PTX|NoDriver", text):
        switch = (", or for a CUDA 12 driver use CuPy's CUDA 12 wheel: make venv DEVICE=gpu "
                  "CUPY=cupy-cuda12x"
                  if wheel == "cupy-cuda13x" else "")
        return (f"device 'gpu': the NVIDIA driver is missing or older than {wheel}'s CUDA ({what}: "
                f"{text[:120]}); update the driver (nvidia-smi shows the newest CUDA it "
                f"supports){switch}")
    if re.search(r"NoDevice|no CUDA-capable device", text):
        return ("device 'gpu': CuPy sees no CUDA GPU; check that nvidia-smi lists one and that "
                "CUDA_VISIBLE_DEVICES does not hide it")
    return f"device 'gpu': {what} failed ({e.__class__.__name__}: {text[:160]}); {GPU_HINT}"


def _self_test(cupy):
    """Run one elementwise kernel, one float32 matmul and one random draw, and check their
    results."""
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    checks = (
        ("an elementwise kernel (compiled by NVRTC)", lambda x: cupy.multiply(x, 2), host * 2),
        ("a float32 matmul (cuBLAS)", lambda x: cupy.matmul(x, x.T), host @ host.T),
        ("a random draw (cuRAND)",
         lambda x: cupy.random.RandomState(0).random_sample((2, 3), dtype=np.float32), None))
    what = "copying an array to the GPU"
    try:
        x = cupy.asarray(host)
        for what, run, expected in checks:
            # the copy back waits for the kernel, so its errors surface here
            got = cupy.asnumpy(run(x))
            ok = (np.all((got >= 0) & (got < 1)) and np.unique(got).size > 1 if expected is None
                  else np.array_equal(got, expected))
            if not ok:
                raise DeviceError(f"device 'gpu': {what} gave wrong results; reinstall CuPy: "
                                  f"{GPU_HINT}")
    except DeviceError:
        raise
    except Exception as e:
        raise DeviceError(_gpu_failure(what, e)) from None


_gpu_error = None   # the DeviceError of a failed first try: CuPy is validated once per process


def _load_cupy():
    global _gpu_error
    if _gpu_error is not None:
        raise _gpu_error
    try:
        try:
            cupy = _import_cupy()
        except Exception as e:  # ImportError, or a broken install that fails while importing
            raise DeviceError(f"device 'gpu' needs CuPy, which could not be imported "
                              f"({e.__class__.__name__}: {' '.join(str(e).split())[:120]}); "
                              f"{GPU_HINT}") from None
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:
            raise DeviceError(_gpu_failure("counting GPUs", e)) from None
        if n < 1:
            raise DeviceError(_gpu_failure("counting GPUs", RuntimeError("no CUDA-capable device")))
        _self_test(cupy)
    except DeviceError as e:
        _gpu_error = e
        raise
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

    The stream is determined by (seed, keys). ``fork(*keys)`` returns an independent stream with a
    generator of its own (one per module); ``reseed(*keys)`` turns this one into the stream of
    ``RNG(seed, device, keys)`` in place: the training loop reseeds one RNG with the step number
    each step, so resuming at step k replays exactly the same masks and noise.
    """

    def __init__(self, seed=0, device="cpu", keys=()):
        self.seed, self.device, self._gen = int(seed), device, None
        self.reseed(*keys)

    def fork(self, *keys):
        return RNG(self.seed, self.device, self.keys + keys)

    def reseed(self, *keys):
        """Restart as the stream of (seed, keys), reusing the device generator; returns self.

        On CuPy a generator is a cuRAND handle whose creation allocates device memory (and so may
        synchronize with the GPU); reseeding it only sets its seed and offset. On NumPy the
        host-side PCG64 is rebuilt, a few microseconds. Both give the same numbers as a new
        RNG(seed, keys)."""
        self.keys = tuple(int(k) for k in keys)
        seq = np.random.SeedSequence([self.seed, *self.keys])
        xp = get_xp(self.device)
        if xp is np:
            self._gen = np.random.Generator(np.random.PCG64(seq))
        else:  # CuPy and test devices: seed the device generator from the same SeedSequence
            seed32 = int(seq.generate_state(1)[0])
            if self._gen is None:
                self._gen = xp.random.RandomState(seed32)
            else:
                self._gen.seed(seed32)
        return self

    def uniform(self, shape, dtype=None):
        """Uniform samples in [0, 1)."""
        dtype = dtype or DEFAULT_DTYPE
        if isinstance(self._gen, np.random.Generator):
            return self._gen.random(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
        return self._gen.random_sample(shape, dtype=dtype)

    def keep_mask(self, shape, p_drop):
        """Boolean mask, each entry True with probability 1 − p_drop (dropout's "keep" mask).

        On NumPy it compares 16-bit random integers with round(p_drop · 65536), about twice as fast
        as float uniforms; p_drop is thereby rounded to a multiple of 1/65536."""
        if isinstance(self._gen, np.random.Generator):
            bits = self._gen.bit_generator
            if math.prod(shape) % 4 or sys.byteorder != "little" or bits.state["has_uint32"]:
                u16 = self._gen.integers(0, 65536, size=shape, dtype=np.uint16)
            else:   # the same integers, four per 64-bit word (low half first), read from the words
                u16 = bits.random_raw(math.prod(shape) // 4).view(np.uint16).reshape(shape)
            return u16 >= round(p_drop * 65536)
        return self._gen.random_sample(shape, dtype=np.float32) >= p_drop

    def gumbel(self, shape, dtype=None):
        """Standard Gumbel noise -log(-log U), with U kept away from 0 and 1 so it is finite."""
        u = self.uniform(shape, dtype)
        xp = array_module(u)
        tiny = float(np.finfo(u.dtype).tiny)
        return -xp.log(-xp.log(xp.clip(u, tiny, 1.0 - float(np.finfo(u.dtype).epsneg))))



_default_rngs = {}


def default_rng(device="cpu"):
    """The stream a random module draws from until ``Module.set_rng`` gives it one: one per device,
    seeded 0 when first used, so a script's dropout masks and Gumbel noise are the same from run to
    run with no set-up. For a seed of your own (and for noise that does not depend on what ran
    before), call ``model.set_rng(RNG(seed, device))``; train.py does, reseeding it every step so a
    resume replays it."""
    if device not in _default_rngs:
        _default_rngs[device] = RNG(0, device)
    return _default_rngs[device]


def keep_freed_memory():
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS.

    By default glibc serves large blocks with mmap and unmaps them on free, so every big temporary
    array of every step pays fresh page faults (kernel time zeroing pages). Raising the mmap and
    trim thresholds keeps them in the heap: on this project's 2-core machines an NDR step made ~2.5×
    fewer page faults (system time 0.62 s → 0.25 s over 9 steps) and a small CRT step ran up to ~2×
    faster. Process-wide, so only the command-line tools call it; set MINATTN_KEEP_MEMORY=0 to skip
    it. Returns True when the setting took effect (Linux with glibc), else False.
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
