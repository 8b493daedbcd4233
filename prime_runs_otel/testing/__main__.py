"""``python -m prime_runs_otel.testing``: serve the fake platform until Ctrl-C."""

from ._command import main

raise SystemExit(main())
