"""The plugin's settings: the ``--oscar-*`` flags, their ``OSCAR_*`` environment variables
and :class:`OscarConfig`.

SGLang parses the flags in the launcher; the ``ServerArgs.from_cli_args`` hook moves them
into ``OSCAR_*`` variables, which SGLang's worker processes inherit, and every process reads
them back with :meth:`OscarConfig.from_env`. ``OSCAR_KV_CACHE_DTYPE=int2`` marks a process
that serves with the INT2 cache (:func:`int2_enabled`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import ArtifactError, expect
from ...spec import DEFAULT_RECENT_SIZE, DEFAULT_SINK_SIZE

INT2 = "int2"
ENV = {
    "dtype": "OSCAR_KV_CACHE_DTYPE",
    "rotation_path": "OSCAR_ROTATION_PATH",
    "sink_size": "OSCAR_SINK_SIZE",
    "recent_size": "OSCAR_RECENT_SIZE",
    "group_size": "OSCAR_GROUP_SIZE",
    "backend": "OSCAR_BACKEND",
    "sink_entries": "OSCAR_SINK_ENTRIES",
    "tokens_per_request": "OSCAR_TOKENS_PER_REQUEST",
}
DEFAULT_SINK_ENTRIES = 32
DEFAULT_TOKENS_PER_REQUEST = 2048


@dataclass(frozen=True)
class OscarConfig:
    """The plugin's settings (from the ``--oscar-*`` flags via ``OSCAR_*`` variables)."""

    rotation_path: str | None = None
    sink_size: int = DEFAULT_SINK_SIZE
    recent_size: int = DEFAULT_RECENT_SIZE
    group_size: int | None = None
    backend: str = "auto"
    sink_entries: int = DEFAULT_SINK_ENTRIES
    tokens_per_request: int = DEFAULT_TOKENS_PER_REQUEST

    @classmethod
    def from_env(cls, environ=None) -> "OscarConfig":
        env = os.environ if environ is None else environ

        def as_int(key, default):
            raw = env.get(ENV[key])
            if raw in (None, ""):
                return default
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{ENV[key]}: expected an integer, got {raw!r}") from None

        return cls(rotation_path=env.get(ENV["rotation_path"]) or None,
                   sink_size=as_int("sink_size", DEFAULT_SINK_SIZE),
                   recent_size=as_int("recent_size", DEFAULT_RECENT_SIZE),
                   group_size=as_int("group_size", None),
                   backend=env.get(ENV["backend"]) or "auto",
                   sink_entries=as_int("sink_entries", DEFAULT_SINK_ENTRIES),
                   tokens_per_request=as_int("tokens_per_request", DEFAULT_TOKENS_PER_REQUEST))

    @classmethod
    def from_args(cls, args) -> "OscarConfig":
        """From SGLang's parsed arguments (``--oscar-*`` flags; defaults where absent)."""
        return cls(rotation_path=getattr(args, "oscar_rotation_path", None),
                   sink_size=getattr(args, "oscar_sink_size", DEFAULT_SINK_SIZE),
                   recent_size=getattr(args, "oscar_recent_size", DEFAULT_RECENT_SIZE),
                   group_size=getattr(args, "oscar_group_size", None),
                   backend=getattr(args, "oscar_backend", "auto"),
                   sink_entries=getattr(args, "oscar_sink_cache_entries", DEFAULT_SINK_ENTRIES),
                   tokens_per_request=getattr(args, "oscar_tokens_per_request",
                                              DEFAULT_TOKENS_PER_REQUEST))

    def to_env(self, environ=None) -> None:
        env = os.environ if environ is None else environ
        env[ENV["dtype"]] = INT2
        for key in ("rotation_path", "sink_size", "recent_size", "group_size", "backend",
                    "sink_entries", "tokens_per_request"):
            val = getattr(self, key)
            if val is None:
                env.pop(ENV[key], None)
            else:
                env[ENV[key]] = str(val)

    def validate(self) -> None:
        expect(self.sink_size >= 0, "--oscar-sink-size", "a non-negative int", self.sink_size)
        expect(self.recent_size >= 0, "--oscar-recent-size", "a non-negative int",
               self.recent_size)
        expect(self.sink_entries >= 0, "--oscar-sink-cache-entries",
               "a non-negative int (0 turns the sink store off)", self.sink_entries)
        expect(self.tokens_per_request >= 1, "--oscar-tokens-per-request", "a positive int",
               self.tokens_per_request)
        expect(self.backend in ("auto", "reference", "triton", "cute"), "--oscar-backend",
               "one of auto, reference, triton, cute", self.backend)
        if self.rotation_path is not None:
            expect(os.path.exists(self.rotation_path), "--oscar-rotation-path",
                   "an existing .safetensors file or a directory", self.rotation_path,
                   ArtifactError)


def int2_enabled(environ=None) -> bool:
    """Whether this process serves with the INT2 cache (set by the ``ServerArgs`` hook)."""
    env = os.environ if environ is None else environ
    return env.get(ENV["dtype"]) == INT2


#: ``(flag, argparse keywords)`` of every ``--oscar-*`` flag (added by the
#: ``ServerArgs.add_cli_args`` hook).
PARSER_FLAGS = (
    ("--oscar-rotation-path", dict(type=str, default=None,
                                   help="INT2 KV cache: rotation artifact (.safetensors file, "
                                        "or a directory with one, or a RotationZoo "
                                        "k_rotation_*.pt / v_rotation_*.pt pair)")),
    ("--oscar-sink-size", dict(type=int, default=DEFAULT_SINK_SIZE,
                               help="INT2 KV cache: first tokens kept in BF16")),
    ("--oscar-recent-size", dict(type=int, default=DEFAULT_RECENT_SIZE,
                                 help="INT2 KV cache: last tokens kept in BF16")),
    ("--oscar-group-size", dict(type=int, default=None,
                                help="INT2 KV cache: channels per scale/zero (default head_dim)")),
    ("--oscar-sink-cache-entries", dict(type=int, default=DEFAULT_SINK_ENTRIES,
                                        help="INT2 KV cache: BF16 sink rows kept per distinct "
                                             "first-sink_size-token prefix, for prefix-cache "
                                             "hits (LRU); taken out of the KV memory budget; "
                                             "0 turns the store off (a prefix hit then "
                                             "recomputes the prompt)")),
    ("--oscar-tokens-per-request", dict(type=int, default=DEFAULT_TOKENS_PER_REQUEST,
                                        help="INT2 KV cache: memory planning; each running "
                                             "request also holds a BF16 window slot, planned "
                                             "inside the KV budget; max running requests are "
                                             "capped at tokens / this")),
    ("--oscar-backend", dict(type=str, default="auto",
                             choices=["auto", "reference", "triton", "cute"],
                             help="INT2 KV cache: kernel backend")),
)
