"""Fixtures of the tests of ``oscar_kernels/integrations/sglang/`` (one test file per module).

The folder is not named ``sglang``: pytest puts ``tests/integrations`` on ``sys.path``, where
a ``sglang`` folder would be imported as the ``sglang`` package when SGLang is not installed
(and ``pytest.importorskip("sglang")`` would not skip).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def hooks_applied():
    """The plugin's hooks applied to SGLang's classes in this process, with int2 enabled."""
    pytest.importorskip("sglang")
    from sglang.srt.plugins.hook_registry import HookRegistry

    from oscar_kernels.integrations.sglang import register

    os.environ["OSCAR_KV_CACHE_DTYPE"] = "int2"
    register()
    HookRegistry.apply_hooks()
    yield
    os.environ.pop("OSCAR_KV_CACHE_DTYPE", None)
