"""Patch ``prime_runs`` the moment it is imported, and not a moment before.

A launcher's start-up hook runs in every Python process it starts, and an
eval starts many that never report a run (harness programs, tool servers). So
this module imports only the standard library: installing the hook costs a
``sys.meta_path`` entry, and a process that never imports ``prime_runs``
pays nothing more. When ``prime_runs`` is imported, its own ``__init__`` runs
first and the patch right after, so ``from prime_runs import init`` done later
(verifiers does it at import time) already finds the patched function.
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

TARGET = "prime_runs"
#: Marks a patched ``init`` and carries the original for ``uninstall()``.
ORIGINAL_ATTRIBUTE = "__prime_runs_otel_original__"

_lock = allocate_lock()


class _PatchAfterImport:
    """A ``sys.meta_path`` finder: finds ``prime_runs`` through the other
    finders and wraps its loader. (Not derived from ``importlib.abc``, whose
    import costs every process more than the rest of the hook.)"""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


class _PatchingLoader:
    """The real loader, then the patch once the module body has run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name: str) -> Any:
        # get_resource_reader, is_package, get_code...: whatever the real one has.
        return getattr(self._loader, name)


_finder = _PatchAfterImport()


def install() -> None:
    """Patch now if ``prime_runs`` is loaded, else as soon as it is."""
    with _lock:
        module = sys.modules.get(TARGET)
        if module is not None and hasattr(module, "init"):
            patch(module)
            return
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Put back what ``install()`` changed, whichever way it went."""
    with _lock:
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        module = sys.modules.get(TARGET)
        if module is not None:
            _restore(module)


def patch(module: ModuleType) -> None:
    """Replace ``prime_runs.init`` (and ``prime_runs.run.init``) with this
    package's; idempotent."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    original = getattr(module, "init", None)
    if original is None or hasattr(original, ORIGINAL_ATTRIBUTE):
        return
    patched = _patched(original)
    module.init = patched  # type: ignore[attr-defined]
    submodule = sys.modules.get(f"{TARGET}.run")
    if submodule is not None and getattr(submodule, "init", None) is original:
        submodule.init = patched  # type: ignore[attr-defined]


def _restore(module: ModuleType) -> None:
    patched = getattr(module, "init", None)
    original = getattr(patched, ORIGINAL_ATTRIBUTE, None)
    if original is None:
        return
    module.init = original  # type: ignore[attr-defined]
    submodule = sys.modules.get(f"{TARGET}.run")
    if submodule is not None and getattr(submodule, "init", None) is patched:
        submodule.init = original  # type: ignore[attr-defined]


def _patched(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(**kwargs: Any) -> Any:
        # Imported on the first call: only a process that opens a run loads
        # the pipeline (the SDK, the spool, the platform clients).
        from .run import init_run

        return init_run(original, **kwargs)

    # What functools.wraps would copy, without importing functools.
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(init, name, getattr(original, name, None))
    init.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(init, ORIGINAL_ATTRIBUTE, original)
    return init
