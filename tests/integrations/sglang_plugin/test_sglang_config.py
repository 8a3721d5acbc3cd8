"""oscar_kernels.integrations.sglang.config: the settings, their environment variables and
the declared entry point (no SGLang needed)."""

from __future__ import annotations

import argparse
import os

import pytest

from oscar_kernels import ArtifactError
from oscar_kernels.integrations.sglang.config import (PARSER_FLAGS, OscarConfig,
                                                      int2_enabled)


def test_config_round_trips_through_env_and_validates(tmp_path):
    env = {}
    OscarConfig(rotation_path=None, sink_size=32, recent_size=128).to_env(env)
    assert int2_enabled(env)
    cfg = OscarConfig.from_env(env)
    assert (cfg.sink_size, cfg.recent_size, cfg.group_size) == (32, 128, None)
    with pytest.raises(ValueError, match="OSCAR_SINK_SIZE"):
        OscarConfig.from_env({"OSCAR_SINK_SIZE": "many"})
    with pytest.raises(ArtifactError, match="--oscar-rotation-path"):
        OscarConfig(rotation_path=str(tmp_path / "missing")).validate()


def test_sink_cache_entries_zero_is_valid():
    OscarConfig(sink_entries=0).validate()
    env = {}
    OscarConfig(sink_entries=0).to_env(env)
    assert OscarConfig.from_env(env).sink_entries == 0
    with pytest.raises(ValueError, match="--oscar-sink-cache-entries: expected a non-negative "
                                         "int .*got -1"):
        OscarConfig(sink_entries=-1).validate()


def test_config_from_parsed_flags():
    parser = argparse.ArgumentParser()
    for flag, kw in PARSER_FLAGS:
        parser.add_argument(flag, **kw)
    args = parser.parse_args(["--oscar-sink-size", "8", "--oscar-sink-cache-entries", "0",
                              "--oscar-backend", "triton"])
    assert OscarConfig.from_args(args) == OscarConfig(sink_size=8, sink_entries=0,
                                                      backend="triton")
    assert OscarConfig.from_args(argparse.Namespace()) == OscarConfig()


def test_entry_point_declared():
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "pyproject.toml")).read()
    assert '[project.entry-points."sglang.srt.plugins"]' in text
    assert 'oscar_int2 = "oscar_kernels.integrations.sglang:register"' in text
