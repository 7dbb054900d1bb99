"""No test can hang the suite: every test runs under a time limit (tests/conftest.py) that fails it by name."""
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import TIME_LIMIT, children, kill_children, time_limit


def test_every_test_runs_under_the_default_limit():
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < remaining <= TIME_LIMIT["default"]


@pytest.mark.time_limit(7)
def test_a_marker_sets_a_tests_own_limit():
    remaining, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < remaining <= 7


def test_a_block_over_its_limit_fails_with_its_name():
    with pytest.raises(pytest.fail.Exception, match="a busy loop ran over its time limit of 0.2 s"):
        with time_limit(0.2, "a busy loop"):
            start = time.monotonic()
            while time.monotonic() - start < 30:   # a hang, cut short by the limit
                pass
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 0   # the test's own limit runs on after the block


def test_a_child_left_running_by_a_test_is_killed():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert p.pid in children()
    kill_children(set())
    assert p.wait(timeout=10) == -signal.SIGKILL and p.pid not in children()
