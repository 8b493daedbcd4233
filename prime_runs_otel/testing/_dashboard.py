"""The dashboard URLs a run is given, answered with a small page.

The platform answers every create with a viewer URL, and the CLI prints it
for the user to open; on the fake platform that address should show
something rather than fail. The page says what the fake holds for the run;
the real dashboard is not faked.
"""

from __future__ import annotations

import copy
import html
import json
import re

from ._http import RUN_ID, Request, Response, Route, route
from ._store import Store


class Dashboard:
    def __init__(self, store: Store) -> None:
        self._store = store

    def routes(self) -> list[Route]:
        return [
            route(
                "GET",
                rf"/dashboard/(?:evaluations|training)/{RUN_ID}",
                self._page,
                "dashboard",
            )
        ]

    def _page(self, request: Request, match: re.Match[str]) -> Response:
        """What the fake platform holds for the run."""
        run_id = match["run_id"]
        store = self._store
        with store.lock:
            run = copy.deepcopy(store.runs.get(run_id))
            episodes = len(store.episodes.get(run_id, {}))
            samples = len(store.samples.get(run_id, []))
        if run is None:
            body = f"<h1>no run {html.escape(run_id)} on this fake platform</h1>"
            return Response(404, _page("run not found", body), "text/html; charset=utf-8")
        rows = "".join(
            f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(value))}</td></tr>"
            for label, value in (
                ("id", run.id),
                ("name", run.name),
                ("kind", run.kind),
                ("status", run.status),
                ("episodes (Prime Traces)", episodes),
                ("sample rows", samples),
                ("metrics", json.dumps(run.metrics, sort_keys=True)),
                ("error", run.error_message or ""),
            )
        )
        body = f"<h1>{html.escape(run.name)}</h1><table>{rows}</table>"
        return Response(200, _page(run.name, body), "text/html; charset=utf-8")


def _page(title: str, body: str) -> bytes:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)} · fake Prime platform</title></head>"
        f"<body>{body}<p>Served by prime-runs-otel's fake platform.</p></body></html>"
    ).encode()
