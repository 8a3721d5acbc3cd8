"""Load a script of perf/ or perf/tools/ as a module (the scripts are not a package)."""

import importlib.util
import os

PERF = os.path.join(os.path.dirname(__file__), "..", "..", "perf")


def load(script: str):
    path = os.path.join(PERF, script)
    if not os.path.exists(path):
        path = os.path.join(PERF, "tools", script)
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
