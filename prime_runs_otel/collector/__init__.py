"""The OTLP receiver behind ``prime-runs-otel serve``: OTLP/HTTP and OTLP/gRPC
in front of the same exporter core, spool and uploader as the in-process path.

A collector only forgets a batch once the receiver has answered it, so the
answer is sent after the spool commit and never before: a batch that was not
committed is answered with a retryable status (503 / ``UNAVAILABLE`` or
``RESOURCE_EXHAUSTED`` with a retry hint) and the collector keeps it in its
queue. Ingestion is idempotent on episode id, so the retries and duplicates a
collector produces are stored once.

Bad input is answered with a 4xx (``INVALID_ARGUMENT`` over gRPC) saying what
is wrong, because a collector drops a batch answered that way instead of
retrying it forever. Spans of a request that are fine are kept even when
others in it are not: those are reported as ``partial_success``.

One module per concern, from the wire inwards: :mod:`.http_front` and
:mod:`.grpc_front` (each transport: routes, reading, answers, its server),
:mod:`.http_connections` (the HTTP connections: their cap and deadlines),
:mod:`.admission` (calls taken at once, the answer to the rest),
:mod:`.bodies` (a body before it is decoded), :mod:`.intake` (a decoded
request to spool commits, whatever the transport), :mod:`.receiver` (the
process that runs them all), :mod:`.receiver_config` (how it listens) and
:mod:`.run_log` (the runs it opens and closes, in its log).
"""
