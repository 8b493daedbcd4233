"""Patch a module the moment it is imported, and not a moment before.

Every instrumentation here patches a module of somebody else's. A
launcher's start-up hook runs in every Python process it starts, and an eval
starts many that never report a run (harness programs, tool servers). So
this module imports only the standard library: installing a hook costs a
``sys.meta_path`` entry, and a process that never imports the module pays
nothing more. When the module is imported, its own ``__init__`` runs first
and the patch right after, so a name taken from it later (``from prime_runs
import init``, done by verifiers at import time) is already the patched one.
"""

from __future__ import annotations

import sys
from _thread import allocate_lock

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs more to import than all of this module
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

__all__ = ["ORIGINAL_ATTRIBUTE", "PatchOnImport", "mark_wrapper", "original_of"]

#: Marks a function this package put in place of another, and carries that
#: other one, so a patch is applied once and undone exactly.
ORIGINAL_ATTRIBUTE = "__prime_runs_otel_original__"


def mark_wrapper(wrapper: Callable[..., Any], original: Callable[..., Any]) -> None:
    """Make ``wrapper`` look like ``original`` (what ``functools.wraps`` would
    copy, without importing functools) and carry it for ``original_of``."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapper, name, getattr(original, name, None))
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, ORIGINAL_ATTRIBUTE, original)


def original_of(function: object) -> Any:
    """What ``function`` wraps if this package put it in place, else None."""
    return getattr(function, ORIGINAL_ATTRIBUTE, None)


class PatchOnImport:
    """``patch(module)`` on ``target`` once it is imported, or at once if it
    already is; ``restore(module)`` undoes it.

    ``loaded_when`` names an attribute the module has once its body has run:
    a module in ``sys.modules`` without it is still being imported, and is
    patched when its import ends.

    The hook is its own ``sys.meta_path`` finder: it finds ``target``
    through the other finders and wraps its loader. (Not derived from
    ``importlib.abc``, whose import costs every process more than the rest
    of the hook.)
    """

    def __init__(
        self,
        target: str,
        patch: Callable[[ModuleType], None],
        restore: Callable[[ModuleType], None],
        *,
        loaded_when: str,
    ) -> None:
        self.target = target
        self._patch = patch
        self._restore = restore
        self._loaded_when = loaded_when
        self._lock = allocate_lock()

    def install(self) -> None:
        """Patch now if the module is loaded, else as soon as it is."""
        with self._lock:
            module = sys.modules.get(self.target)
            if module is not None and hasattr(module, self._loaded_when):
                self.patch(module)
                return
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        """Put back what ``install()`` changed, whichever way it went."""
        with self._lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            module = sys.modules.get(self.target)
            if module is not None:
                self._restore(module)

    def patch(self, module: ModuleType) -> None:
        """Apply the patch (it must be idempotent); the hook's work is done."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._patch(module)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != self.target:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self.patch)  # type: ignore[assignment]
                return spec
        return None


class _PatchingLoader:
    """The real loader, then the patch once the module body has run."""

    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        # get_resource_reader, is_package, get_code...: whatever the real one has.
        return getattr(self._loader, name)
