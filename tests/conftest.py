import contextlib
import os
import signal
import time

import pytest

from minattn import backend
from minattn.tools import strict  # noqa: F401  (registers the "strict" test device)

REQUIRE_GPU = os.environ.get("MINATTN_REQUIRE_GPU") == "1"


def _skip_or_fail_without_gpu():
    if backend.gpu_available():
        return
    if REQUIRE_GPU:   # the cause itself (CuPy missing, no driver, a missing CUDA library), not a generic hint
        try:
            backend.get_xp("gpu")
        except backend.DeviceError as e:
            pytest.fail(f"MINATTN_REQUIRE_GPU=1 but the GPU is not usable: {e}")
    pytest.skip("no CUDA GPU (set MINATTN_REQUIRE_GPU=1 to make this a failure)")


@pytest.fixture(params=["cpu", "strict", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    """Every device test runs on NumPy, on the strict no-implicit-transfer device, and on CuPy."""
    if request.param == "gpu":
        _skip_or_fail_without_gpu()
    return request.param


# --- one time limit per test ------------------------------------------------------------------------------
# A regressed guard (a generator that never stops drawing, a lock never released) must fail its own test, by
# name, rather than hang the suite. SIGALRM interrupts the test's main thread as pytest-timeout's "signal"
# method does, with no dependency. `@pytest.mark.time_limit(s)` sets a test's own limit.
TIME_LIMIT = {"default": 300, "slow": 3600}   # seconds; generous for a loaded 2-core machine


@contextlib.contextmanager
def time_limit(seconds, name):
    """Fail the block with ``name`` once it has run ``seconds`` (wall clock)."""
    def expired(signum, frame):
        pytest.fail(f"{name} ran over its time limit of {seconds} s", pytrace=False)

    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)   # an enclosing limit's time left, or 0
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:   # a block inside a test: the test's own limit runs on
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


def children():
    """The child processes of this one that tests start (from the main thread), as Linux lists them in one
    file; where it does not, none are known. (Scanning /proc instead cost ~1 ms a test.)"""
    path = f"/proc/self/task/{os.getpid()}/children"
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {int(pid) for pid in f.read().split()}


def kill_children(keep):
    """SIGKILL every child process but ``keep``: a test that failed or ran out of time leaves none behind
    (a 100,000-step train.py would run on for hours)."""
    for pid in children() - keep:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _time_limit(request):
    mark = request.node.get_closest_marker("time_limit")
    slow = request.node.get_closest_marker("slow") is not None
    seconds = mark.args[0] if mark else TIME_LIMIT["slow" if slow else "default"]
    before = children()
    try:
        if not hasattr(signal, "SIGALRM"):   # Windows has no alarm signal: the suite runs unguarded there
            yield
        else:
            with time_limit(seconds, request.node.nodeid):
                yield
    finally:
        kill_children(before)
