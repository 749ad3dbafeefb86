"""Question packages that are also the API's functions: `lmperf.bench(...)` and `lmperf.bench.spec`.

A package and a function of the same name cannot both be attributes of `lmperf` (importing the
package `lmperf.bench` rebinds the name), so the package itself is made callable: its module
object gets a subclass of ModuleType whose `__call__` runs the API function (module `__class__`
assignment is supported by Python since 3.5).
"""

from __future__ import annotations

import importlib
import sys
import types


def make_callable(module_name: str, target: str) -> None:
    """Make module `module_name` callable as the function "package.module:function" `target`
    (imported on the first call, so importing the package stays cheap)."""
    module = sys.modules[module_name]
    target_module, _, attr = target.partition(":")

    class CallableModule(types.ModuleType):
        def __call__(self, *args: object, **kwargs: object) -> object:
            return getattr(importlib.import_module(target_module), attr)(*args, **kwargs)

    CallableModule.__call__.__doc__ = f"Run {target} (see its docstring)."
    module.__class__ = CallableModule
