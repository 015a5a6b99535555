"""Started by the ``sitecustomize`` that ``traintop run`` puts first on the child's
``PYTHONPATH``: waits for torch (and the HF and Lightning trainers) to be imported by
the script, then hands them to ``probes.attach.attach``. Standard library only: a
Python process that never imports torch (a tool the script runs, torchrun's own
helpers) pays for one import finder and nothing else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: Set by ``traintop run`` in the child's environment: attach there only.
ATTACH_ENV = "TRAINTOP_ATTACH"

#: The modules whose import is waited for, and what ``attach`` does then.
TARGETS = {
    "torch": "torch_imported",
    "transformers.trainer": "hf_imported",
    "lightning.pytorch.trainer.trainer": "lightning_imported",
    "pytorch_lightning.trainer.trainer": "lightning_imported",
}


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then ``then(module)`` once the module has run."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            self._then(module)
        except Exception as exc:  # never into the script's import
            print(f"traintop: not attached: {type(exc).__name__}: {exc}", file=sys.stderr)

    def __getattr__(self, name: str) -> Any:  # resources, source, ... as the loader's own
        return getattr(self._loader, name)


class _Waiting(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the modules in ``TARGETS``."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = TARGETS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenLoader(spec.loader, _attach_hook(hook))
                return spec
        return None


def _attach_hook(name: str) -> Callable[[ModuleType], None]:
    def then(module: ModuleType) -> None:
        from probes.attach import attach  # (torch is loaded by now)

        getattr(attach, name)(module)

    return then


def install() -> None:
    """Wait for the targets' imports (in the child of ``traintop run`` only)."""
    if os.environ.get(ATTACH_ENV) != "1" or any(isinstance(f, _Waiting) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Waiting())
