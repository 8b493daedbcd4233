"""The environments hub: what an eval run's environment references resolve to.

An eval run is created with environment ids, so a client first resolves each
environment it names: ``owner/name`` through the hub's ``@latest`` (only an
environment published there exists; a test publishes one with
:meth:`~.fake_platform.FakePlatform.add_environment`), a bare name through a
get-or-create within the team.
"""

from __future__ import annotations

import re

from ._fields import optional_str, required_str
from ._http import Request, Response, Route, json_response, not_found, route
from ._store import Store, new_id


class EnvironmentsHub:
    def __init__(self, store: Store) -> None:
        self._store = store

    def routes(self) -> list[Route]:
        return [
            route("POST", r"/api/v1/environmentshub/resolve", self._resolve),
            route(
                "GET",
                r"/api/v1/environmentshub/(?P<owner>[^/]+)/(?P<name>[^/]+)/@latest",
                self._latest,
            ),
        ]

    def publish(self, owner: str, name: str) -> str:
        """Publish ``owner/name`` so ``@latest`` resolves it; returns its id."""
        store = self._store
        with store.lock:
            slug = f"{owner}/{name}"
            environment_id = store.published_environments.get(slug)
            if environment_id is None:
                environment_id = new_id("env_")
                store.published_environments[slug] = environment_id
                store.environment_names[environment_id] = name
            return environment_id

    def _resolve(self, request: Request, match: re.Match[str]) -> Response:
        """Get-or-create by name within a team: a replay returns the same id."""
        body = request.json_object()
        name = required_str(body, "name")
        team_id = optional_str(body, "team_id")
        store = self._store
        with store.lock:
            environment_id = store.named_environments.get((team_id, name))
            if environment_id is None:
                environment_id = new_id("env_")
                store.named_environments[(team_id, name)] = environment_id
                store.environment_names[environment_id] = name
        return json_response(200, {"data": {"id": environment_id, "name": name}})

    def _latest(self, request: Request, match: re.Match[str]) -> Response:
        slug = f"{match['owner']}/{match['name']}"
        with self._store.lock:
            environment_id = self._store.published_environments.get(slug)
        if environment_id is None:
            raise not_found(f"Environment {slug}")
        return json_response(200, {"data": {"id": environment_id, "name": match["name"]}})
