"""What the ``prime_rl`` instrumentation patches: ``prime_rl.monitors.setup``,
the moment ``prime_rl.monitors`` is imported (see ``..hook``).

Standard library only, like the hook: the launcher installs it in every
Python process it starts (``uv run rl`` starts the orchestrator, the trainer,
inference servers and environment servers). Only a process that imports
``prime_rl.monitors`` is patched, and only one that calls ``setup`` loads
the pipeline.
"""

from __future__ import annotations

from ..hook import ORIGINAL_ATTRIBUTE, PatchOnImport, mark_wrapper, original_of

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs more to import than all of this module
    from collections.abc import Callable, Coroutine
    from types import ModuleType
    from typing import Any

__all__ = ["HOOK", "ORIGINAL_ATTRIBUTE", "TARGET", "install", "uninstall"]

TARGET = "prime_rl.monitors"


def patch_setup(module: ModuleType) -> None:
    """Replace ``prime_rl.monitors.setup`` with this package's; idempotent.
    prime-rl calls it as ``monitors.setup(...)`` on the module, so the
    module's attribute is the one place to patch."""
    original = getattr(module, "setup", None)
    if original is None or original_of(original) is not None:
        return
    module.setup = _patched(module, original)  # type: ignore[attr-defined]


def restore_setup(module: ModuleType) -> None:
    original = original_of(getattr(module, "setup", None))
    if original is not None:
        module.setup = original  # type: ignore[attr-defined]


def _patched(
    module: ModuleType, original: Callable[..., Coroutine[Any, Any, None]]
) -> Callable[..., Coroutine[Any, Any, None]]:
    async def setup(*args: Any, **kwargs: Any) -> None:
        # Imported on the first call: only a process that sets its monitors
        # up loads the pipeline (the SDK, the spool, the platform clients).
        from .monitor import patched_setup

        await patched_setup(module, original, args, kwargs)

    mark_wrapper(setup, original)
    return setup


HOOK = PatchOnImport(TARGET, patch_setup, restore_setup, loaded_when="setup")
#: Patch now if ``prime_rl.monitors`` is loaded, else as soon as it is.
install = HOOK.install
#: Put back what ``install()`` changed, whichever way it went.
uninstall = HOOK.uninstall
