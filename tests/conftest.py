import os

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
