"""Write bytecode for what llmpress imports, once, at setup.

Where PYTHONDONTWRITEBYTECODE is set (as on these machines) Python never writes bytecode
itself, and every process compiled torch and transformers again at import: 10 s of an
`llmpress eval`'s 29. Compiling all of site-packages does it for 15,000 files (33 s of a
fresh setup on 2 idle cores, 64 s of CPU); a compress and an eval import 2,500 of them.
So this process imports every module of the `compress` package, the transformers model
class (and so its config's) of every family it supports and the test tools setup
installs, with bytecode writing on: each module is compiled as it is imported, and its
bytecode kept. A module some later command imports that this one did not is compiled at
that import, as it would be without this script. It took 22 s (22 s of CPU) in the same
fresh setup.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys

sys.dont_write_bytecode = False  # before any import below: they write their bytecode

import transformers  # noqa: E402

import compress  # noqa: E402
from compress.model.adapters import ADAPTERS  # noqa: E402

for module in pkgutil.walk_packages(compress.__path__, "compress."):
    if module.name.endswith(".__main__"):  # which would run the CLI
        continue
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as e:  # an optional dependency this platform lacks (triton)
        if (e.name or "").startswith("compress"):
            raise
for adapter in ADAPTERS.values():
    getattr(transformers, adapter.architecture)
for name in ("pytest", "xdist", "openai", "compressed_tensors"):  # the dev extra's
    if importlib.util.find_spec(name) is not None:
        importlib.import_module(name)
print(f"bytecode for {len(sys.modules)} modules")
