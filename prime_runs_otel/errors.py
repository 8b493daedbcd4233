"""The exceptions this package raises on purpose.

One base class lets callers catch everything that is the package telling them
something is wrong with *their input* (a setting, a config file, a record),
as opposed to a bug or a platform outage, which surface as their own types.
"""

from __future__ import annotations


class PrimeRunsOtelError(Exception):
    """Base of every error raised deliberately by prime-runs-otel."""


class ConfigError(PrimeRunsOtelError, ValueError):
    """A setting or run config that cannot be used as given.

    A ``ValueError`` too, so code that already guards configuration parsing with
    ``except ValueError`` keeps working.
    """


class RecordError(PrimeRunsOtelError, ValueError):
    """Something offered as an episode record is not one, or arrived damaged.

    Raised on the producer side before any span is emitted (so a bad record
    never reaches the platform half-written), and on the consumer side when a
    transported record fails its size or digest check.
    """
