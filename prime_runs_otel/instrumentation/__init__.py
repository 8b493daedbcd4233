"""OpenTelemetry instrumentations of other packages' run reporting.

Nothing here is imported by the rest of the package: an instrumentation is
loaded by name, through the ``opentelemetry_instrumentor`` entry point or the
``prime-runs-otel run`` launcher.
"""
