"""OpenTelemetry instrumentations of other packages' run reporting.

Nothing here is imported by the rest of the package: an instrumentation is
loaded by name, through the ``opentelemetry_instrumentor`` entry point or the
``prime-runs-otel run`` launcher.

What every instrumentation shares lives at this level: ``hook.py`` (patch
the instrumented module the moment it is imported), ``instrumentor.py``
(the ``BaseInstrumentor`` that installs such a hook), ``launcher.py`` with
``startup.py`` and ``_startup/`` (reach every process a command starts) and
``delivery.py`` (in process or to other exporters, as
``OTEL_TRACES_EXPORTER`` says). Each subpackage is one instrumentation's own
mapping: what it patches and how the instrumented API becomes a run.

This package's ``__init__`` and the hooks import only the standard library:
the launcher's start-up imports them in every process it starts.
"""
