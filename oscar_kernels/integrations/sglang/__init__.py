"""SGLang plugin: ``--kv-cache-dtype int2`` on stock SGLang, no fork.

``pip install oscar-kernels[sglang]`` declares :func:`register` as ``oscar_int2`` in
SGLang's ``sglang.srt.plugins`` entry-point group. SGLang calls
``sglang.srt.plugins.load_plugins()`` early in every process (launcher, engine,
scheduler/model workers), and :func:`register` adds the plugin's hooks to SGLang's
``HookRegistry``. Usage, constraints and measurements: docs/integrations.md.

One module per concern, imported in this order (each imports only those before it):

==================  ========================================================================
``config``          the ``--oscar-*`` flags, ``OSCAR_*`` variables, :class:`OscarConfig`
``checks``          what is rejected at startup (server arguments, models)
``artifact``        loading the rotation artifact, slicing it per TP rank
``memory_plan``     the bytes of the INT2 pool and the capacity that fits SGLang's budget
``cuda_graphs``     the decode CUDA-graph batch sizes SGLang captures
``pages``           page tables from ``req_to_token``, window rebuild from pages
``prefix``          the prefix-cache cut and the sink-store key
``state``           :class:`PluginState`: what the hooks record for the pool and backend
``pool``            :class:`OscarInt2TokenToKVPool` (imports SGLang)
``backend``         :class:`OscarInt2AttnBackend` (imports SGLang)
``hooks``           the hook functions and the table :func:`register` installs
==================  ========================================================================

Importing this package imports no SGLang code; ``pool`` and ``backend`` are imported when a
hook first needs them.
"""

from __future__ import annotations

import logging

from .hooks import HOOKS

log = logging.getLogger(__name__)


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group: register the plugin's hooks."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in HOOKS:
        HookRegistry.register(target, fn, getattr(HookType, kind))
    log.info("oscar int2: SGLang plugin registered %d hooks", len(HOOKS))
