"""``prime-runs-otel ui``: the local viewer of the store in the browser
(:mod:`prime_runs_otel.view`), on loopback unless told otherwise.

Only the wiring is here: the options, the token a listener beyond loopback
needs (as ``serve`` does), the address printed and opened. The viewer's
web parts (Starlette, Jinja2) come with the ``ui`` extra and are imported
only here, when the command runs: every other command works without them.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import webbrowser
from typing import Any

from .._net import is_loopback
from ..config import spool_dir_setting, spool_max_bytes_setting
from ..deliver.spool import Spool
from .arguments import parse_since, port_number, spool_option
from .exits import EXIT_OK, UsageError
from .extras import UI, require
from .store.lookup import SPOOL_FILE, first_run_hint, open_store, spool_exists, store_folder

__all__ = ["TOKEN_ENV", "add_ui_command"]

TOKEN_ENV = "PRIME_RUNS_OTEL_UI_TOKEN"
DEFAULT_PORT = 8765


def cmd_ui(args: argparse.Namespace) -> int:
    if not args.token and not is_loopback(args.host):
        raise UsageError(
            f"ui listens on {args.host}, beyond this machine, so it needs a token: pass --token "
            f"or set {TOKEN_ENV} (the address printed then carries it), or listen on 127.0.0.1"
        )
    require("ui", UI, "ui")
    from ..view.server import ViewerServer  # here: the viewer's server is the [ui] extra's

    # Not store_folder(): a folder that does not exist yet is a store to come
    # here, not a typo, since the viewer shows runs as they arrive.
    folder = spool_dir_setting(args.spool_dir)
    if folder.exists() and not folder.is_dir():
        store_folder(args.spool_dir)  # says that a file is not a store folder
    if not spool_exists(folder):
        # An empty store, as the first run would create it: the runs page
        # says how to fill it and shows runs as they arrive.
        Spool(folder / SPOOL_FILE, max_bytes=spool_max_bytes_setting()).close()
        print(f"the store at {folder} is empty; {first_run_hint()}", flush=True)
    spool = open_store(args.spool_dir)
    server = ViewerServer(
        spool, host=args.host, port=args.port, token=args.token, since=parse_since
    )
    url = browsable_url(server.url, args.host)
    print(f"viewer of {spool.path}: {url}", flush=True)
    if url != server.url:
        print(f"from other machines: {other_machines_url(url)}", flush=True)
    print("read-only; Ctrl-C stops it", flush=True)
    if not args.no_browser and not webbrowser.open(url):
        print("(no browser could be opened here: open the address above)", file=sys.stderr)
    server.serve()
    return EXIT_OK


def browsable_url(url: str, host: str) -> str:
    """The address a browser on this machine opens: a server listening on
    every interface (``0.0.0.0``, ``::``) is reached on loopback, since no
    browser can open the unspecified address itself."""
    try:
        unspecified = ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        unspecified = host == ""
    if not unspecified:
        return url
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return url.replace(f"//{shown}:", "//127.0.0.1:", 1)


def other_machines_url(url: str) -> str:
    """``url`` with this machine's name in place of loopback."""
    return url.replace("//127.0.0.1:", f"//{socket.gethostname()}:", 1)


def add_ui_command(commands: Any, common: argparse.ArgumentParser) -> None:
    ui = commands.add_parser(
        "ui",
        parents=[common],
        help="look at the runs in the local store in the browser",
        description="Serve a read-only viewer of the local store (runs, a run's distributions, "
        "errors and curves, its episodes, runs side by side) and open it in the browser.",
    )
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    ui.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free one)",
    )
    ui.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"token a browser must present (default: ${TOKEN_ENV}); required when listening "
        "beyond loopback",
    )
    ui.add_argument(
        "--no-browser", action="store_true", help="print the address, do not open a browser"
    )
    spool_option(ui)
    ui.set_defaults(func=cmd_ui)
