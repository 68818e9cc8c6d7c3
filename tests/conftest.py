"""Shared fixtures: tiny configs and images, so the suite stays fast on 2 CPU cores."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    # PyTorch must load before TensorFlow: importing torchvision (through timm) after
    # TensorFlow segfaults in this pair of wheels. The weight tests need both.
    import timm  # noqa: F401
    import torch  # noqa: F401
except ImportError:
    pass

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# dim 32, depth 2, 32 x 32 images: the suite's standard model.
TINY = dict(image_size=32, patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=10)


@pytest.fixture
def tiny_config():
    return dict(TINY)


@pytest.fixture
def images():
    return np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")


@pytest.fixture(autouse=True)
def _float32_policy():
    """Tests that change the global dtype policy must not leak it into others."""
    yield
    keras.config.set_dtype_policy("float32")


_PARITY = []


@pytest.fixture
def record_parity():
    """Records a measured max |difference| so the run ends with the parity table."""

    def record(case, difference, tolerance):
        _PARITY.append((case, difference, tolerance))
        return difference

    return record


def pytest_terminal_summary(terminalreporter):
    if not _PARITY:
        return
    terminalreporter.section("parity with reference implementations (max |difference|)")
    for case, difference, tolerance in _PARITY:
        terminalreporter.write_line(f"{case:<72} {difference:.2e}  (tolerance {tolerance:.0e})")
