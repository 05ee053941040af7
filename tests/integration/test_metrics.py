"""Metrics of a real server (fake engines), on by default: gRPC's standard server metrics
(gRFC A66 names) for gRPC calls only, the reward server's own metrics with a ``transport``
label, ``GET /metrics`` on the HTTP door and on the metrics port, and every query of the shipped
Grafana dashboard names a metric the server exports."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from reward_server import domain as d
from reward_server.backends.fake import FakeJudge
from reward_server.client import RewardCallError
from reward_server.config import load_config
from reward_server.errors import BackendUnavailable

from .conftest import Running, running_server

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "reward-server.json"
TOKEN = "m3trics"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
RULES = ('The text mentions "coffee".',)
SCORE = "reward.v1.RewardService/Score"
# series the dashboard reads that a server of this test cannot produce samples for (declared
# all the same: the family is in /metrics)
RAY_ONLY = {"reward_server_engine_calls_total", "reward_server_engine_in_flight"}
ON_REFUSAL = {"reward_server_admission_refused_total"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def _post(url: str, body: object) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), headers=AUTH)
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.status


def parse(text: str) -> tuple[Samples, set[str]]:
    """(samples by (name, labels), every series name the families declare)."""
    samples: Samples = {}
    declared: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",), "info": ("_info",), "summary": ("_sum", "_count", "")}
    for family in text_string_to_metric_families(text):
        declared.update(family.name + s for s in suffixes.get(family.type, ("",)))
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
            declared.add(s.name)
    return samples, declared


def total(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[Running]:
    async with running_server(["server.http.port=0", f"server.auth_token={TOKEN}"],
                              judge=FakeJudge()) as r:
        yield r


async def scrape(r: Running, where: str = "http") -> Samples:
    port = r.app.http_port if where == "http" else r.app.metrics_port
    status, content_type, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
    return parse(text)[0]


async def traffic(r: Running) -> None:
    """A few calls of each kind over both transports: OK, policy-invalid, refused, failed."""
    rubric = d.RubricScoreSpec(context="c", text="Coffee, always.", rules=RULES)
    nli = d.NliConstraintsSpec(response="I like tea.", answer="Tea.", preference="tea")
    async with r.client(token=TOKEN) as c:
        await c.score([d.ScoreItem("a", rubric), d.ScoreItem("b", nli),
                       d.ScoreItem("empty", d.RubricScoreSpec(context="c", text=" ", rules=RULES))])
        await c.info()
    async with r.client(token="wrong") as c:
        with pytest.raises(RewardCallError):
            await c.info()
    assert isinstance(r.judge, FakeJudge)
    r.judge.fail_with = BackendUnavailable("the judge is gone")
    try:
        async with r.client(token=TOKEN, max_retries=0) as c:
            with pytest.raises(RewardCallError):
                await c.score([d.ScoreItem("x", rubric), d.ScoreItem("y", rubric)])
    finally:
        r.judge.fail_with = None
    async with grpc.aio.insecure_channel(r.target) as channel:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    base = f"http://127.0.0.1:{r.app.http_port}"
    item = {"id": "h", "rubric_score": {"context": "c", "text": "Coffee.", "rules": list(RULES)}}
    assert await asyncio.to_thread(_post, f"{base}/v1/score", {"items": [item]}) == 200
    refused = await asyncio.to_thread(_get, f"{base}/v1/info", {"Authorization": "Bearer wrong"})
    assert refused[0] == 401


async def test_metrics_are_on_by_default() -> None:
    config = load_config(env={})
    assert config.server.metrics_port == 0  # a free port, on server.host (loopback)
    assert config.server.host == "127.0.0.1"


async def test_grpc_standard_metrics_count_grpc_calls_only(server: Running) -> None:
    before = await scrape(server)
    await traffic(server)
    after = await scrape(server)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    # gRPC Score calls: the OK one and the failed one; the HTTP door's Score is not among them
    assert delta("grpc_server_call_started_total", grpc_method=SCORE) == 2
    assert delta("grpc_server_call_duration_seconds_count", grpc_method=SCORE, grpc_status="OK") == 1
    assert delta("grpc_server_call_duration_seconds_count", grpc_method=SCORE,
                 grpc_status="UNAVAILABLE") == 1
    assert delta("grpc_server_call_duration_seconds_count", grpc_method="reward.v1.RewardService/Info",
                 grpc_status="UNAUTHENTICATED") == 1
    assert delta("grpc_server_call_duration_seconds_count", grpc_method="grpc.health.v1.Health/Check",
                 grpc_status="OK") == 1
    assert delta("grpc_server_call_rcvd_total_compressed_message_size_bytes_sum", grpc_method=SCORE) > 100
    assert delta("grpc_server_call_sent_total_compressed_message_size_bytes_sum", grpc_method=SCORE) > 50
    # the reward server's own call metrics tell the transports apart
    assert delta("reward_server_rpc_calls_total", rpc="Score", transport="grpc") == 2
    assert delta("reward_server_rpc_calls_total", rpc="Score", transport="http", code="OK") == 1
    # refused tokens, both doors (refused before the call reaches the servicer)
    for transport in ("grpc", "http"):  # gRPC's Info with a wrong token; HTTP's GET /v1/info: 401
        assert delta("reward_server_rpc_calls_total", rpc="Info", transport=transport,
                     code="UNAUTHENTICATED") == 1, transport
    # per kind: items by outcome, rewards
    assert delta("reward_server_items_total", kind="rubric_score", status="ok") == 2
    assert delta("reward_server_items_total", kind="rubric_score", status="policy_invalid") == 1
    assert delta("reward_server_items_total", kind="rubric_score", status="failed") == 2
    assert delta("reward_server_items_total", kind="nli_constraints", status="ok") == 1
    assert delta("reward_server_reward_count", kind="rubric_score") == 3
    assert delta("reward_server_batch_items_count", deployment="judge") >= 1
    assert delta("reward_server_batch_queue_wait_seconds_count", deployment="judge") >= 1


async def test_metrics_port_serves_the_same_registry(server: Running) -> None:
    assert server.app.metrics_port not in (None, 0, server.app.http_port)
    on_port = await scrape(server, "port")
    assert total(on_port, "grpc_server_call_started_total") > 0
    assert total(on_port, "reward_server_rpc_calls_total") > 0


async def test_metrics_route_is_get_only_and_open(server: Running) -> None:
    base = f"http://127.0.0.1:{server.app.http_port}"
    status, _, _ = await asyncio.to_thread(_get, f"{base}/metrics", {})  # no token needed
    assert status == 200
    request = urllib.request.Request(f"{base}/metrics", b"{}", headers=AUTH)
    with pytest.raises(urllib.error.HTTPError) as e:
        await asyncio.to_thread(urllib.request.urlopen, request, None, 10)
    assert e.value.code == 405


# ------------------------------------------------------------------ the dashboard's queries
FUNCTIONS = {
    "abs", "avg", "avg_over_time", "ceil", "clamp_max", "clamp_min", "count", "delta", "deriv",
    "floor", "histogram_quantile", "increase", "irate", "max", "max_over_time",
    "min", "min_over_time", "quantile", "rate", "round", "sum", "sum_over_time", "topk", "vector",
}  # (label_values is Grafana's, for variables)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "offset", "bool"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (strings, label matchers, ranges and grouping
    label lists removed; every other identifier is a known function or keyword, or a metric)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    assert s.count("(") == s.count(")") and s.count("{") == s.count("}"), f"unbalanced: {expr!r}"
    s = re.sub(r"\{[^{}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\blabel_values\s*\(([^,()]*),[^()]*\)", r" \1 ", s)  # Grafana's: (metric, label)
    names: set[str] = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", s):
        token = m.group()
        if s[m.end():].lstrip().startswith("("):
            assert token in FUNCTIONS, f"unknown PromQL function {token!r} in {expr!r}"
        elif token not in KEYWORDS:
            names.add(token)
    return names


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_query_parser_finds_names() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, rpc) (rate(a_b_bucket{job=~"$job", x="y(z"}'
            '[$__rate_interval]))) / on (rpc) group_left sum(c_total) - d')
    assert metric_names(expr) == {"a_b_bucket", "c_total", "d"}
    assert metric_names("label_values(e_total, job)") == {"e_total"}
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        metric_names("frobnicate(x)")


async def test_every_dashboard_query_names_an_exported_metric(server: Running) -> None:
    await traffic(server)
    status, _, text = await asyncio.to_thread(
        _get, f"http://127.0.0.1:{server.app.http_port}/metrics")
    assert status == 200
    samples, declared = parse(text)
    with_samples = {name for name, _ in samples}
    queries = dashboard_queries()
    assert len(queries) >= 20
    used: set[str] = set()
    for expr in queries:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        missing = names - declared
        assert not missing, f"{expr!r} reads {sorted(missing)}, which the server does not export"
        used |= names
    # and after these calls, everything but the Ray-only and refusal series has samples
    without = (used - RAY_ONLY - ON_REFUSAL) - with_samples
    assert not without, f"no samples of {sorted(without)} after the calls"
    # every standard gRPC server metric is on the dashboard
    assert {"grpc_server_call_started_total", "grpc_server_call_duration_seconds_bucket",
            "grpc_server_call_rcvd_total_compressed_message_size_bytes_bucket",
            "grpc_server_call_sent_total_compressed_message_size_bytes_bucket"} <= used


async def test_streaming_calls_are_counted_when_they_end(server: Running) -> None:
    """grpc.health.v1 Watch (server-streaming): started at once, its duration and status when
    the client goes away."""
    watch = "grpc.health.v1.Health/Watch"
    before = await scrape(server)
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first = await call.read()  # SERVING, or NOT_SERVING just after traffic()'s failed judge
        assert first.status in (health_pb2.HealthCheckResponse.SERVING,
                                health_pb2.HealthCheckResponse.NOT_SERVING)
        call.cancel()
    for _ in range(50):  # the server learns of the cancellation a moment later
        after = await scrape(server)
        ended = total(after, "grpc_server_call_duration_seconds_count", grpc_method=watch,
                      grpc_status="CANCELLED") - total(before, "grpc_server_call_duration_seconds_count",
                                                       grpc_method=watch, grpc_status="CANCELLED")
        if ended:
            break
        await asyncio.sleep(0.05)
    assert ended == 1
    assert total(after, "grpc_server_call_started_total", grpc_method=watch) - total(
        before, "grpc_server_call_started_total", grpc_method=watch) == 1
    assert total(after, "grpc_server_call_sent_total_compressed_message_size_bytes_sum",
                 grpc_method=watch) > 0


async def test_concurrent_calls_count_their_own_bytes(server: Running) -> None:
    """Many calls of two methods and two sizes at once, over raw bytes: the received bytes of
    the calls that succeeded are exactly what those calls sent, each in its own size's bucket
    (the per-call counts are kept per call, not shared between the calls in flight); the calls
    the token check refuses are counted too. (Admission may refuse some calls on a slow
    machine: those are left out of the expected figures, by their status.)"""
    from reward_server._proto.reward.v1 import reward_pb2 as pb

    small = pb.ScoreRequest(items=[pb.ScoreItem(id="s", rubric_score=pb.RubricScore(
        context="c", text="Coffee.", rules=list(RULES)))]).SerializeToString()
    large = pb.ScoreRequest(items=[pb.ScoreItem(id=f"l{i}", rubric_score=pb.RubricScore(
        context="c", text="Coffee, always. " * 20, rules=list(RULES))) for i in range(40)]
    ).SerializeToString()
    md = (("authorization", f"Bearer {TOKEN}"),)
    before = await scrape(server)
    async with grpc.aio.insecure_channel(server.target) as channel:
        score = channel.unary_unary("/" + SCORE)
        info = channel.unary_unary("/reward.v1.RewardService/Info")
        sends = [score(body, metadata=md) for body in [small] * 30 + [large] * 30]
        sends += [info(b"", metadata=(("authorization", "Bearer nope"),)) for _ in range(20)]
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
    ok = [not isinstance(o, BaseException) for o in outcomes]
    small_ok, large_ok = sum(ok[:30]), sum(ok[30:60])
    assert small_ok and large_ok, outcomes
    assert all(isinstance(o, grpc.aio.AioRpcError) and o.code() is grpc.StatusCode.UNAUTHENTICATED
               for o in outcomes[60:])
    after = await scrape(server)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    rcvd = "grpc_server_call_rcvd_total_compressed_message_size_bytes"
    assert delta(f"{rcvd}_sum", grpc_method=SCORE, grpc_status="OK") == (
        small_ok * len(small) + large_ok * len(large))
    assert delta(f"{rcvd}_count", grpc_method=SCORE, grpc_status="OK") == small_ok + large_ok
    # each Score call's own size lands in its own bucket
    assert len(small) < 1024 < len(large)
    assert delta(f"{rcvd}_bucket", grpc_method=SCORE, grpc_status="OK", le="1024.0") == small_ok
    assert delta("grpc_server_call_duration_seconds_count", grpc_method="reward.v1.RewardService/Info",
                 grpc_status="UNAUTHENTICATED") == 20
