"""Load a script of perf/ or perf/tools/ as a module (the scripts are not a package)."""

import importlib.util
import os
import sys

PERF = os.path.join(os.path.dirname(__file__), "..", "..", "perf")
if os.path.abspath(PERF) not in sys.path:     # the scripts import each other (cute_bench)
    sys.path.insert(0, os.path.abspath(PERF))


def load(script: str):
    path = os.path.join(PERF, script)
    if not os.path.exists(path):
        path = os.path.join(PERF, "tools", script)
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
