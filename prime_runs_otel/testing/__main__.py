"""``python -m prime_runs_otel.testing``: serve the fake platform until Ctrl-C."""

from .fake_platform import main

raise SystemExit(main())
