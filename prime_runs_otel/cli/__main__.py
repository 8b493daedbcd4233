"""``python -m prime_runs_otel.cli``: the same as ``prime-runs-otel``."""

import sys

from . import main

sys.exit(main())
