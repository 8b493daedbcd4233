"""Readers of the spans other instrumentations write, one module per family.

Code traced by the OpenTelemetry GenAI instrumentations, by OpenInference or
by OpenLLMetry carries the same model calls spelled three ways. Each family's
module (:mod:`.genai`, :mod:`.openinference`, :mod:`.openllmetry`) knows its
own attribute names and turns them into the shapes of :mod:`.messages`;
:mod:`.calls` asks each in turn, so the record builder
(:mod:`prime_runs_otel.read.synthesis`) and the span buffer
(:mod:`prime_runs_otel.read.span_tree`) never name a family's attributes.
A fourth family is a module here and a line in :mod:`.calls`.
"""
