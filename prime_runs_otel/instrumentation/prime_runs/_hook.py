"""What the ``prime_runs`` instrumentation patches: ``prime_runs.init``, the
moment ``prime_runs`` is imported (see ``..hook``).

Standard library only, like the hook: the launcher installs it in every
Python process it starts. The pipeline behind the patched ``init`` is
imported by its first call.
"""

from __future__ import annotations

import sys

from ..hook import ORIGINAL_ATTRIBUTE, PatchOnImport, mark_wrapper, original_of

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs more to import than all of this module
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["HOOK", "ORIGINAL_ATTRIBUTE", "TARGET", "install", "uninstall"]

TARGET = "prime_runs"


def patch_init(module: ModuleType) -> None:
    """Replace ``prime_runs.init`` (and ``prime_runs.run.init``) with this
    package's; idempotent."""
    original = getattr(module, "init", None)
    if original is None or original_of(original) is not None:
        return
    patched = _patched(original)
    module.init = patched  # type: ignore[attr-defined]
    submodule = sys.modules.get(f"{TARGET}.run")
    if submodule is not None and getattr(submodule, "init", None) is original:
        submodule.init = patched  # type: ignore[attr-defined]


def restore_init(module: ModuleType) -> None:
    patched = getattr(module, "init", None)
    original = original_of(patched)
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
        from .patched_init import init_run

        return init_run(original, **kwargs)

    mark_wrapper(init, original)
    return init


HOOK = PatchOnImport(TARGET, patch_init, restore_init, loaded_when="init")
#: Patch now if ``prime_runs`` is loaded, else as soon as it is.
install = HOOK.install
#: Put back what ``install()`` changed, whichever way it went.
uninstall = HOOK.uninstall
