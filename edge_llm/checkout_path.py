"""A checkout's root on sys.path must not shadow distributions named like our source folders.

``kernels/`` and ``quant/`` sit at the top of a checkout and install as ``edge_llm.kernels``
and ``edge_llm.quant`` (pyproject's package-dir). A process started in the checkout's root
(``python -m pytest``, ``python -m edge_llm.cli``, ``python -c``) has that root on sys.path,
where those folders pass for top-level packages named ``kernels`` and ``quant``. transformers
imports the Hub's ``kernels`` distribution (``from kernels import CUDAProperties``) whenever it
finds one, so finding our folder instead broke every ``import transformers.<model>``.

The fix sits where the wrong name is resolved, so the import order does not matter: each
folder's ``__init__.py`` checks the name it is imported under and, when that is the bare
name, calls ``defer_to_installed`` instead of running its body. That puts the installed
distribution of the name (found on sys.path without the checkout's root) into ``sys.modules``
in its place, and the importer gets it. When no such distribution is installed, the module
stays an empty namespace (no ``__file__``, no submodules): what Python makes of a folder
without ``__init__.py``, and what transformers' availability check reads as "not installed".
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType


def _same_dir(a: str, b: str) -> bool:
    return os.path.normcase(os.path.abspath(a or os.curdir)) == os.path.normcase(
        os.path.abspath(b))


def defer_to_installed(name: str, init_file: str) -> ModuleType | None:
    """Replace the module being imported as ``name`` (a checkout's source folder whose
    ``__init__.py`` is ``init_file``) by the distribution of that name installed elsewhere on
    sys.path; returns that module, or None (and empties the folder's module) when there is
    none. Only for the folder's ``__init__`` while it is being imported under ``name``."""
    own = sys.modules[name]
    root = os.path.dirname(os.path.dirname(os.path.abspath(init_file)))
    rest = [p for p in sys.path if not _same_dir(p, root)]
    spec = importlib.machinery.PathFinder.find_spec(name, rest)
    if spec is None or spec.loader is None:
        own.__file__ = None  # an empty namespace: nothing of the folder is importable by name
        own.__path__ = []
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the import system hands the importer what sys.modules holds
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules[name] = own
        raise
    return module
