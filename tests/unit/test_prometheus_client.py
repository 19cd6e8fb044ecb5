"""eagle3_operator.prometheus against a tiny local aiohttp server: the query it sends, the answers it reads,
and how it fails (unreachable, refused, not Prometheus)."""

from __future__ import annotations

import asyncio
import inspect
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from eagle3_operator.observability import canary_queries
from eagle3_operator.prometheus import (
    PrometheusError,
    query_edges,
    query_track_edges,
    query_track_figures,
    query_value,
    query_vector,
)

Handler = Callable[[web.Request], Any]


def vector(*values: str) -> dict[str, Any]:
    result = [{"metric": {"track": "canary"}, "value": [1700000000.0, v]} for v in values]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest_asyncio.fixture
async def prometheus() -> AsyncIterator[tuple[list[dict[str, str]], Callable[[Handler], None], str]]:
    """(the queries received, set the handler, the base URL)."""
    seen: list[dict[str, str]] = []
    handler: list[Handler] = [lambda request: web.json_response(vector("1"))]

    async def query(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.query) | {"path": request.path, "method": request.method})
        response = handler[0](request)
        return await response if inspect.isawaitable(response) else response

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/api/v1/query_range", query)
    server = TestServer(app)
    await server.start_server()
    try:
        yield seen, lambda h: handler.__setitem__(0, h), str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_an_instant_query_sends_the_expression_and_time(prometheus: Any) -> None:
    seen, _, url = prometheus
    assert await query_vector(url + "/", "up", at=1700000000.5) == vector("1")["data"]["result"]
    assert seen == [{"query": "up", "time": "1700000000.500", "path": "/api/v1/query", "method": "GET"}]


async def test_a_value_is_a_float_and_no_series_or_nan_is_none(prometheus: Any) -> None:
    _, answer, url = prometheus
    answer(lambda r: web.json_response(vector("41.25")))
    assert await query_value(url, "x") == 41.25
    answer(lambda r: web.json_response(vector()))
    assert await query_value(url, "x") is None
    answer(lambda r: web.json_response(vector("NaN")))
    assert await query_value(url, "x") is None


async def test_track_figures_query_the_tracks_scope_over_the_window(prometheus: Any) -> None:
    seen, answer, url = prometheus
    values = {"spec_decode": "1.52", "time_per_output_token": "40.8", "request_success": "123"}

    def by_metric(request: web.Request) -> web.Response:
        key = next(k for k in values if k in request.query["query"])
        return web.json_response(vector(values[key]))

    answer(by_metric)
    scope = canary_queries.track_scope("ns", "run", "canary", 600)
    figures = await query_track_figures(url, scope)
    assert (figures.acceptance_length, figures.output_tokens_per_second, figures.requests) == (
        1.52,
        40.8,
        123,
    )
    queries = sorted(s["query"] for s in seen)
    assert all('namespace="ns", run="run", track="canary"' in q and "[600s]" in q for q in queries)
    assert queries == sorted(
        [
            canary_queries.acceptance_length(scope),
            canary_queries.output_tokens_per_second(scope),
            canary_queries.finished_requests(scope),
        ]
    )


def matrix(*series: tuple[str, list[tuple[float, str]]]) -> dict[str, Any]:
    """A range query's answer: (the series' __name__, its [time, value] points) each."""
    result = [{"metric": {"__name__": name}, "values": [list(v) for v in values]} for name, values in series]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


async def test_a_range_query_gives_each_counter_at_every_edge_and_none_where_it_had_none(
    prometheus: Any,
) -> None:
    seen, answer, url = prometheus
    # three sub-windows of 100 s from 1000: edges 1000, 1100, 1200, 1300; `drafts` has no sample yet at
    # 1000 and a NaN at 1200; `accepted` has every edge
    drafts = [(1100, "10"), (1200, "NaN"), (1300, "40")]
    accepted = [(1000, "0"), (1100, "5"), (1200, "9"), (1300, "20")]
    answer(lambda r: web.json_response(matrix(("drafts", drafts), ("accepted", accepted))))
    got = await query_edges(url, "x", start=1000.0, count=3, step=100.0)
    assert got == {"drafts": (None, 10.0, None, 40.0), "accepted": (0.0, 5.0, 9.0, 20.0)}
    assert seen == [
        {
            "query": "x",
            "start": "1000.000",
            "end": "1300.000",
            "step": "100.000",
            "path": "/api/v1/query_range",
            "method": "GET",
        }
    ]
    answer(lambda r: web.json_response({"status": "success", "data": {"resultType": "matrix", "result": []}}))
    assert await query_edges(url, "x", start=1000.0, count=3, step=100.0) == {}
    assert await query_edges(url, "x", start=1000.0, count=0, step=100.0) == {}
    assert len(seen) == 2, "no sub-window: no query"


async def test_track_edges_ask_the_tracks_counters_by_name_with_the_sub_window_as_the_step(
    prometheus: Any,
) -> None:
    seen, answer, url = prometheus
    answer(lambda r: web.json_response(matrix((canary_queries.TPOT_COUNT, [(1000.0, "3"), (1003.333, "9")]))))
    matchers = canary_queries.track_matchers("ns", "run", "stable")
    got = await query_track_edges(url, matchers, 1000.0, 1, 3.333)
    assert got == {canary_queries.TPOT_COUNT: (3.0, 9.0)}
    [asked] = seen
    assert asked["query"] == canary_queries.window_counters(matchers) and asked["step"] == "3.333"
    assert asked["query"].startswith("sum by (__name__) ({__name__=~")
    assert 'namespace="ns", run="run", track="stable"' in asked["query"]
    assert all(name in asked["query"] for name in canary_queries.WINDOW_COUNTERS)


def test_a_range_is_whole_seconds_or_milliseconds_and_one_second_at_the_least() -> None:
    assert [canary_queries.range_text(x) for x in (600, 3.3333, 0.2, 100.0)] == [
        "600s",
        "3333ms",
        "1s",
        "100s",
    ]


async def test_a_refused_query_says_what_prometheus_said(prometheus: Any) -> None:
    _, answer, url = prometheus
    error = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
    answer(lambda r: web.json_response(error, status=400))
    with pytest.raises(
        PrometheusError, match=r"refused the query \(HTTP 400, bad_data: parse error at char 3\)"
    ):
        await query_vector(url, "sum(")


async def test_an_answer_that_is_not_prometheus_names_the_url(prometheus: Any) -> None:
    _, answer, url = prometheus
    answer(lambda r: web.Response(text="<html>login</html>", content_type="text/html"))
    with pytest.raises(PrometheusError, match=r"no JSON.*Prometheus server's base URL"):
        await query_vector(url, "up")
    answer(lambda r: web.json_response({"status": "success", "data": {"resultType": "matrix", "result": []}}))
    with pytest.raises(PrometheusError, match="a matrix, not a vector"):
        await query_vector(url, "up[5m]")
    answer(lambda r: web.json_response(vector("1")))
    with pytest.raises(PrometheusError, match="a vector, not a matrix"):
        await query_edges(url, "up", 1000.0, 2, 10.0)


async def test_an_unreachable_prometheus_says_what_to_check() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(
        PrometheusError, match=r"does not answer.*prometheusUrl or the operator's --prometheus-url"
    ):
        await query_vector(f"http://127.0.0.1:{port}", "up", timeout_seconds=2)


async def test_a_silent_prometheus_times_out(prometheus: Any) -> None:
    _, answer, url = prometheus

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response(vector("1"))

    answer(slow)
    with pytest.raises(PrometheusError, match="no answer in time"):
        await query_vector(url, "up", timeout_seconds=0.3)
