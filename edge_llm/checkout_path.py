"""A checkout's root on sys.path must not shadow distributions named like our source folders.

``kernels/`` and ``quant/`` sit at the top of a checkout and install as ``edge_llm.kernels``
and ``edge_llm.quant`` (pyproject's package-dir). But a process started in the checkout's root
(``python -m pytest``, ``python -m edge_llm.cli``, ``python -c``) has that root on sys.path,
where those folders pass for top-level packages. Recent transformers (5.25 here; 5.17 did
not) depends on the Hub's ``kernels`` distribution and imports it (``from kernels import
CUDAProperties``); finding our folder instead, every ``import transformers.<model>`` fails.

``unshadow()`` runs when edge_llm is imported: for each of those names that would resolve to
the checkout's folder while an installed distribution of that name exists elsewhere on
sys.path, it puts the installed one into ``sys.modules`` first (loaded lazily, on first use),
so later imports get it. When no such distribution is installed, the name is marked absent
(``None`` in ``sys.modules``), as it is for a wheel install: transformers 5.17, which does not
depend on the Hub's ``kernels`` but imports it when found, had imported our folder as
``kernels``. Nothing happens outside a checkout (a wheel install has no such folders beside
it) or when the name is already imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

SOURCE_FOLDERS = ("kernels", "quant")


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unshadow(names: tuple[str, ...] = SOURCE_FOLDERS, root: str | None = None) -> list[str]:
    """Import the installed distribution behind each shadowed name, or mark the name absent
    when none is installed; returns the names done."""
    root = os.path.normcase(root or _root())
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return []  # not a checkout
    done = []
    for name in names:
        if name in sys.modules or not os.path.isdir(os.path.join(root, name)):
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = os.path.normcase(os.path.abspath(found.origin or "")) if found else ""
        if not origin.startswith(os.path.join(root, name) + os.sep):
            continue  # not shadowed: the name resolves elsewhere, or to nothing
        rest = [p for p in sys.path if os.path.normcase(os.path.abspath(p or os.curdir)) != root]
        spec = importlib.machinery.PathFinder.find_spec(name, rest)
        if spec is None or spec.loader is None:  # no such distribution installed
            sys.modules[name] = None  # `import name` fails, find_spec says None
            done.append(name)
            continue
        # lazily: the distribution's own imports (torch, for one) wait for its first use
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        done.append(name)
    return done
