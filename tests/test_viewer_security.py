"""The viewer against hostile names, addresses and records, in the style of
a web framework's own security suite: every link the viewer writes opens
exactly the object it names, whatever the id (property-based, through the
app and through a real server); no route or query value answers 500; the
token's redirect stays on the viewer and its headers are built from safe
parts; an episode page has a size bound whatever the record; direction
overrides never reach a page raw; every page obeys a Content-Security-Policy
without inline script.

Runs are stored through the spool's own ingest path (what every exporter
commits with), into a real SQLite file per test module."""

from __future__ import annotations

import asyncio
import html
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markupsafe import escape
from viewer_runs import open_spool, record_eval

from prime_runs_otel.deliver.spool import EpisodeFilter, Spool
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunIdentity, RunStart
from prime_runs_otel.view import episodes as episodes_view
from prime_runs_otel.view.app import POLICY, ViewerApp
from prime_runs_otel.view.html import visible
from prime_runs_otel.view.server import ViewerServer

TOKEN = "s3cret-token"


def _store(spool: Spool, run_id: str, episode_ids: list[str], *, name: str | None = None) -> None:
    arrivals = []
    for index, episode_id in enumerate(episode_ids):
        record = synthetic_episode(index, seed=2)
        record["id"] = episode_id
        arrivals.append(EpisodeArrival.of(record, orjson.dumps(record)))
    spool.intake.ingest(
        [RunBatch(RunIdentity(run_id, name=name), start=RunStart({}), episodes=arrivals)],
        mode="local",
    )


def call(
    app: Any, target: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """``GET target`` (raw bytes, as a client sent them) through the ASGI app."""
    path, _, query = target.partition(b"?")
    scope = {
        "type": "http",
        "method": "GET",
        "path": path.decode("latin-1"),
        "raw_path": path,
        "query_string": query,
        "headers": headers or [(b"host", b"127.0.0.1")],
        "root_path": "",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "http_version": "1.1",
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    answer_headers: dict[str, str] = {}
    for name, value in start["headers"]:
        answer_headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    body = b"".join(message.get("body", b"") for message in sent[1:])
    return start["status"], answer_headers, body


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spool]:
    folder = tmp_path_factory.mktemp("security") / "spool"
    opened = open_spool(folder)
    yield opened
    opened.close()


# -- every link opens its own object ---------------------------------------------------

HOSTILE = [
    "team/run-1",
    "victim%41",
    "victimA",
    "run%2F50%25",
    "../../api/runs",
    "..",
    ".",
    "~",
    "~.",
    "a?b#c",
    "report\u202eexe.txt",
    "\u00e9t\u00e9 \u20ac / 日本",
    "%",
    "%%",
    "\\evil",
    "//evil.example",
]


def _links(page: bytes, prefix: str) -> list[str]:
    return [
        html.unescape(href)
        for href in re.findall(r'href="([^"]*)"', page.decode("utf-8"))
        if html.unescape(href).startswith(prefix)
    ]


def _shown(value: str) -> str:
    """``value`` as a page writes it."""
    return str(escape(visible(value)))


def _opens(app: Any, run_id: str, episode_id: str) -> None:
    """The runs list's link of ``run_id`` opens it (its page and its status
    are its own); from its episode table, the link of ``episode_id`` opens
    that episode, and its download is that episode's record."""
    status, _, page = call(app, b"/")
    assert status == 200
    run_links = {href for href in _links(page, "/runs/") if href.count("/") == 2}
    opened = {}
    for href in run_links:
        status, _, body = call(app, href.encode("ascii"))
        assert status == 200, (href, body[:300])
        _, _, answer = call(app, b"/api" + href.encode() + b"/status")
        opened[orjson.loads(answer)["id"]] = (href, body.decode())
    assert run_id in opened, (run_id, run_links)
    link, body = opened[run_id]
    assert f"<td>{_shown(run_id)}</td>" in body
    _, _, table = call(app, link.encode() + b"/episodes")
    records = {}
    for href in _links(table, link + "/episodes/"):
        status, _, record = call(app, href.encode() + b"/record")
        assert status == 200, href
        records[orjson.loads(record)["id"]] = href
    assert episode_id in records, (episode_id, records)
    _, _, episode_page = call(app, records[episode_id].encode())
    assert _shown(episode_id) in episode_page.decode()


@pytest.mark.parametrize("run_id", HOSTILE)
def test_each_hostile_id_opens_from_its_own_link(tmp_path: Path, run_id: str) -> None:
    spool = open_spool(tmp_path / "spool")
    _store(spool, "victimA", ["victim-episode"])
    _store(spool, run_id, [run_id + "/episode%41"])
    app = ViewerApp(spool)
    _opens(app, run_id, run_id + "/episode%41")
    spool.close()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(run_id=st.text(min_size=1, max_size=30), episode_id=st.text(min_size=1, max_size=30))
def test_any_id_opens_from_its_own_link(
    tmp_path_factory: pytest.TempPathFactory, run_id: str, episode_id: str
) -> None:
    spool = open_spool(tmp_path_factory.mktemp("any") / "spool")
    try:
        _store(spool, run_id, [episode_id])
        _opens(ViewerApp(spool), run_id, episode_id)
    finally:
        spool.close()


def test_hostile_ids_open_through_a_real_server(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    for index, run_id in enumerate(HOSTILE):
        _store(spool, run_id, [f"{run_id}#{index}"])
    with ViewerServer(spool, port=0) as running, httpx.Client(base_url=running.url) as client:
        page = client.get("/").content
        links = {href for href in _links(page, "/runs/") if href.count("/") == 2}
        assert len(links) == len(HOSTILE)
        opened = set()
        for href in links:
            answer = client.get(f"/api{href}/status")
            assert answer.status_code == 200, href
            opened.add(answer.json()["id"])
            episodes = client.get(f"{href}/episodes")
            (episode,) = [link for link in _links(episodes.content, href + "/episodes/")]
            assert client.get(episode).status_code == 200
        assert opened == set(HOSTILE)
    spool.close()


# -- no input gets a 500 ---------------------------------------------------------------

PARAMS = [
    "page",
    "sort",
    "order",
    "min_reward",
    "max_reward",
    "min_tokens",
    "max_tokens",
    "min_duration",
    "max_duration",
    "error",
    "example",
    "step",
    "status",
    "kind",
    "name",
    "since",
    "part",
    "more",
    "run",
    "x",
]


@pytest.fixture(scope="module")
def filled(spool: Spool) -> tuple[Spool, str, str]:
    _store(spool, "fuzzed-run", [f"episode-{index}" for index in range(5)])
    episode = spool.reading.episode_rows("fuzzed-run", EpisodeFilter(), limit=1)[0].episode_id
    return spool, "fuzzed-run", episode


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(
        [
            "/",
            "/runs/{run}",
            "/runs/{run}/episodes",
            "/runs/{run}/episodes/{episode}",
            "/runs/{run}/episodes/{episode}/record",
            "/compare",
            "/api/runs",
            "/api/runs/{run}/status",
            "/static/{any}",
            "/{any}",
            "/runs/{any}/episodes/{any}",
        ]
    ),
    anything=st.binary(max_size=30),
    query=st.lists(
        st.tuples(
            st.sampled_from(PARAMS),
            st.one_of(
                st.text(max_size=30),
                st.integers().map(str),
                st.floats().map(str),
                st.sampled_from(
                    [
                        "99999999999999999999999",
                        "-1",
                        "0",
                        "1e400",
                        "nan",
                        "inf",
                        "9" * 400,
                        "reward",
                        "asc",
                        "live",
                        "1",
                    ]
                ),
            ),
        ),
        max_size=4,
    ),
    raw_query=st.binary(max_size=40),
)
@example(route="/", anything=b"", query=[], raw_query=b"min_tokens=%FF%FE&page=%00&&=&%")
def test_no_route_or_query_value_gets_a_500(
    filled: tuple[Spool, str, str],
    route: str,
    anything: bytes,
    query: list[tuple[str, str]],
    raw_query: bytes,
) -> None:
    spool, run_id, episode_id = filled
    from urllib.parse import quote_from_bytes, urlencode

    path = route.format(run=run_id, episode=episode_id, any=quote_from_bytes(anything, safe="/%"))
    target = path.encode() + b"?" + urlencode(query).encode() + b"&" + raw_query
    status, headers, body = call(ViewerApp(spool), target)
    assert status in (200, 400, 404), (target, status, body[:300])
    assert b"Traceback" not in body
    assert headers["content-security-policy"] == POLICY


def test_huge_numbers_in_filters_are_refused_with_a_400(filled: tuple[Spool, str, str]) -> None:
    spool, run_id, _ = filled
    app = ViewerApp(spool)
    for query in (
        "min_tokens=99999999999999999999999",
        "max_tokens=-99999999999999999999999",
        "step=99999999999999999999999",
        "page=99999999999999999999999",
        "min_reward=1e400",
        "step=-1",
        "page=0",
    ):
        status, _, body = call(app, f"/runs/{run_id}/episodes?{query}".encode())
        assert status == 400, (query, body[:300])
    status, _, body = call(app, b"/?status=nonsense")
    assert status == 400 and b"one of" in body


# -- the token's redirect and headers --------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        b"//evil.example/?token=" + TOKEN.encode(),
        b"///evil.example/?token=" + TOKEN.encode(),
        b"/%5Cevil.example?token=" + TOKEN.encode(),
        b"/\\evil.example?token=" + TOKEN.encode(),
        b"/%E2%82%AC?token=" + TOKEN.encode(),
        b"/\xe2\x82\xac?token=" + TOKEN.encode(),
        b"/%0d%0aSet-Cookie:%20x=1?token=" + TOKEN.encode(),
        b"/runs/x?token=" + TOKEN.encode() + b"&a=%0d%0a%E2%82%AC",
    ],
)
def test_the_token_redirect_stays_on_the_viewer(spool: Spool, target: bytes) -> None:
    app = ViewerApp(spool, token=TOKEN)
    status, headers, _ = call(app, target)
    assert status == 303
    location = headers["location"]
    assert location.startswith("/") and not location.startswith(("//", "/\\"))
    assert location.isascii() and "\r" not in location and "\n" not in location
    assert "\\" not in location
    assert urlsplit(urljoin("http://127.0.0.1:8765/a/b", location)).netloc == "127.0.0.1:8765"
    assert TOKEN not in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]


def test_a_token_link_with_any_path_gets_an_answer_from_a_real_server(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    _store(spool, "a-run", ["e"])
    with ViewerServer(spool, port=0, token=TOKEN) as running:
        for path in (b"/%E2%82%AC", b"/%0d%0aX:%20y", b"/\xe2\x82\xac", b"//evil.example/"):
            with socket.create_connection(("127.0.0.1", running.port), timeout=30) as connection:
                connection.sendall(
                    b"GET " + path + b"?token=" + TOKEN.encode() + b" HTTP/1.1\r\n"
                    b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                answer = b""
                while chunk := connection.recv(65536):
                    answer += chunk
            head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
            status = int(head.split()[1])
            assert status in (303, 400), (path, head)
            if status == 303:
                (location,) = re.findall(r"(?im)^location: (.*)$", head)
                assert location.startswith("/") and not location.startswith("//"), head
        with httpx.Client(base_url=f"http://127.0.0.1:{running.port}") as client:
            entered = client.get("/runs/a-run?token=" + TOKEN)
            assert entered.status_code == 303 and entered.headers["location"] == "/runs/a-run"
            assert client.get("/runs/a-run").status_code == 200  # the cookie
            assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
            client.cookies.clear()
            assert client.get("/runs/a-run").status_code == 401
            client.cookies.set("prime_runs_otel_ui", TOKEN)
            assert client.get("/runs/a-run").status_code == 401  # the cookie is not the token
    spool.close()


# -- an episode page is bounded --------------------------------------------------------


@pytest.mark.parametrize("shape", ["tool_calls", "ampersands", "messages", "traces", "metrics"])
def test_an_episode_page_stays_within_its_budget(tmp_path: Path, shape: str) -> None:
    spool = open_spool(tmp_path / "spool")
    record = synthetic_episode(0, seed=1)
    trace = record["traces"][0]
    node = trace["nodes"][-1]
    if shape == "tool_calls":
        node["message"]["tool_calls"] = [
            {
                "id": str(i),
                "type": "function",
                "function": {"name": "&" * 50, "arguments": "&<\u202e" * 100},
            }
            for i in range(20_000)
        ]
    elif shape == "ampersands":
        for each in trace["nodes"]:
            each["message"]["content"] = "&" * 19_999
        trace["nodes"] = trace["nodes"] * 40
    elif shape == "messages":
        trace["nodes"] = [{"message": {"role": "user", "content": "<&>" * 100}}] * 30_000
    elif shape == "traces":
        record["traces"] = [trace] * 2000
    else:
        trace["metrics"] = {"&" * 500 + str(i): float(i) for i in range(20_000)}
    body = orjson.dumps(record)
    spool.intake.ingest(
        [
            RunBatch(
                RunIdentity("big"),
                start=RunStart({}),
                episodes=[EpisodeArrival(record["id"], body, _digest(record), None)],
            )
        ],
        mode="local",
    )
    app = ViewerApp(spool)
    href = f"/runs/big/episodes/{record['id']}"
    status, _, page = call(app, href.encode())
    assert status == 200
    assert len(page) < episodes_view.PAGE_BUDGET + 64 * 1024, (shape, len(body), len(page))
    assert b"ownload the whole record" in page
    if shape == "tool_calls":
        assert b"19900 more tool call(s) not shown" in page
    elif shape == "traces":
        assert b"1950 more trace(s) not shown" in page
    elif shape in ("ampersands", "messages"):
        assert b"Show more" in page
        status, _, more = call(app, href.encode() + b"?more=1")
        assert status == 200 and len(page) < len(more) < episodes_view.MORE_BUDGET + 64 * 1024
    status, headers, raw = call(app, href.encode() + b"/record")
    assert status == 200 and raw == body and "attachment" in headers["content-disposition"]
    spool.close()


def _digest(record: dict[str, Any]) -> Any:
    from prime_runs_otel.read.episodes import digest_episode

    return digest_episode(record)


# -- direction overrides and inline script ---------------------------------------------


def test_direction_overrides_are_shown_as_escapes(tmp_path: Path) -> None:
    spool = open_spool(tmp_path / "spool")
    name = "report\u202eexe.txt"
    _store(spool, "bidi-run", ["episode\u2067x"], name=name)
    app = ViewerApp(spool)
    for target in (
        b"/",
        b"/runs/bidi-run",
        b"/runs/bidi-run/episodes",
        b"/runs/bidi-run/episodes/episode%E2%81%A7x",
    ):
        status, _, page = call(app, target)
        assert status == 200
        text = page.decode()
        assert "\u202e" not in text and "\u2067" not in text, target
    assert "report\\u202eexe.txt" in call(app, b"/")[2].decode()
    css = call(app, b"/static/viewer.css")[2].decode()
    assert "unicode-bidi: isolate" in css
    spool.close()


def test_no_page_carries_inline_script_or_style(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    run_id = record_eval(spool_dir, name="<script>alert(1)</script>")
    spool = open_spool(spool_dir)
    episode = spool.reading.episode_rows(run_id, EpisodeFilter(), limit=1)[0].episode_id
    app = ViewerApp(spool)
    for target in (
        "/",
        f"/runs/{run_id}",
        f"/runs/{run_id}/episodes",
        f"/runs/{run_id}/episodes/{episode}",
        f"/compare?run={run_id}&run={run_id}",
        "/nowhere",
    ):
        _, headers, page = call(app, target.encode())
        text = page.decode()
        assert headers["content-security-policy"] == POLICY and "unsafe-inline" not in POLICY
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), target
        assert not re.search(r"\son[a-z]+\s*=", text), target
        assert not re.search(r"<style|\sstyle\s*=", text), target
        assert "<script>alert(1)" not in text
    spool.close()


# -- what ui needs, and what show does not ---------------------------------------------

_BLOCK = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('starlette', 'jinja2'):\n"
    "            raise ImportError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "from prime_runs_otel.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_ui_without_its_extra_says_what_to_install_and_show_needs_none(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    run_id = record_eval(spool_dir)
    env = {"PRIME_RUNS_OTEL_DIR": str(spool_dir), "PATH": "/usr/bin:/bin"}
    ui = subprocess.run(
        [sys.executable, "-c", _BLOCK, "ui", "--no-browser", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ui.returncode == 2, ui.stderr
    assert "needs starlette, jinja2" in ui.stderr and "[ui]'" in ui.stderr, ui.stderr
    show = subprocess.run(
        [sys.executable, "-c", _BLOCK, "show", run_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert show.returncode == 0, show.stderr
    assert "demo-eval" in show.stdout


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.binary(max_size=40), rest=st.binary(max_size=40))
def test_any_token_link_redirects_to_a_path_of_the_viewer(
    spool: Spool, path: bytes, rest: bytes
) -> None:
    app = ViewerApp(spool, token=TOKEN)
    status, headers, _ = call(
        app, b"/" + path.replace(b"?", b"") + b"?" + rest + b"&token=" + TOKEN.encode()
    )
    assert status == 303
    location = headers["location"]
    assert location.isascii() and not any(ord(char) < 0x21 for char in location)
    assert (
        location.startswith("/") and not location.startswith(("//", "/\\")) and "\\" not in location
    )
    assert urlsplit(urljoin("http://127.0.0.1:8765/a/b", location)).netloc == "127.0.0.1:8765"
