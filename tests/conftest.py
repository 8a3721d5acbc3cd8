import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

# Triton kernels run on the CPU under the interpreter; it must be chosen before triton is
# imported anywhere, so it is set here, at collection start.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """Capability skips live here: GPU tests need CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on an H100/H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen():
    g = torch.Generator().manual_seed(1234)
    return g
