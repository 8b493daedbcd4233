"""What a command needs beyond the package's own dependencies, and what to
install when it is missing.

``pip install`` of the package gives what a run in process needs (the SDK,
the exporter, the spool, the uploader, the store commands). The OTLP
receiver (``serve``) and the viewer (``ui``) need servers of their own,
which are extras: a command that needs one checks for its modules first and
says the exact command that installs them, rather than failing on an import
deep inside.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from .exits import UsageError

__all__ = ["SERVE", "UI", "require", "require_testing"]

#: The modules each extra brings that its command imports.
SERVE = ("uvicorn", "h11", "grpc", "google.rpc", "prometheus_client")
UI = ("uvicorn", "starlette", "jinja2")


def require(extra: str, modules: tuple[str, ...], command: str) -> None:
    """Raise a :class:`UsageError` naming the install command when any of
    ``modules`` cannot be imported."""
    missing = [name for name in modules if not _importable(name)]
    if missing:
        raise UsageError(
            f"`prime-runs-otel {command}` needs {', '.join(missing)}, which this installation "
            f"lacks: {install_command(extra)}"
        )


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def install_command(extra: str) -> str:
    """``pip install -e 'CLONE[extra]'`` for a package installed from a
    clone (the usual way: it is not published), else the extra by name."""
    clone = Path(__file__).resolve().parents[2]
    if (clone / "pyproject.toml").is_file():
        return f"pip install -e '{clone}[{extra}]'"
    return f"pip install 'prime-runs-otel[{extra}]'"


def require_testing(command: str) -> None:
    """The fake platform is in a clone only (the wheel leaves ``testing/``
    out): a :class:`UsageError` saying so where it is missing."""
    if importlib.util.find_spec("prime_runs_otel.testing") is None:
        raise UsageError(
            f"`prime-runs-otel {command}` runs the fake platform, which comes with a clone of "
            "prime-runs-otel, not with the installed package: install it from the clone "
            "(pip install -e CLONE) and run it from there"
        )
