"""Start-up hook of ``prime-runs-otel run``: every Python process the command
starts (its folder is first on ``PYTHONPATH``) installs each
instrumentation's hook, which patches its package once it is imported, and
otherwise pays only for these few files. Then the ``sitecustomize`` this one
hides, if the interpreter has one, runs as usual."""

import os
import sys


def _instrument() -> None:
    try:
        from prime_runs_otel.instrumentation import startup
    except ImportError:
        # Another interpreter (a system tool, a harness in its own venv):
        # nothing of this package is there to report with, and nothing to say.
        return
    startup.install_hooks()


def _run_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    spec.loader.exec_module(module)


_instrument()
_run_hidden_sitecustomize()
