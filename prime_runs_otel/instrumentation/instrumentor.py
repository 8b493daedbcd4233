"""The OpenTelemetry ``BaseInstrumentor`` every instrumentation here is:
``instrument()`` installs its lazy hook, ``uninstrument()`` takes it out.

``opentelemetry-instrument`` loads each through the
``opentelemetry_instrumentor`` entry point; the launcher does not need this
module (nor opentelemetry-instrumentation), it installs the hooks itself.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from .hook import PatchOnImport

__all__ = ["HookInstrumentor"]


class HookInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """An instrumentation that is its import hook.

    Lazy: if the instrumented package is not imported yet, nothing is
    imported now; the patch is applied the moment it is. ``tracer_provider``
    is not taken: a run's spans need a provider of their own, whose Resource
    names the run.
    """

    #: The hook ``instrument()`` installs.
    hook: ClassVar[PatchOnImport]
    #: The releases of the instrumented package whose surface this reproduces.
    instruments: ClassVar[tuple[str, ...]]

    def instrumentation_dependencies(self) -> Collection[str]:
        return self.instruments

    def _instrument(self, **kwargs: Any) -> None:
        self.hook.install()

    def _uninstrument(self, **kwargs: Any) -> None:
        self.hook.uninstall()
