"""deploy/grafana/voxgate.json queries only metrics and labels the gateway really exports.

The names and label sets come from the registry itself (``GatewayMetrics``), so the check stays
true as metrics are added; a metric renamed or removed, or a label the dashboard groups by that
the metric does not have, fails here instead of leaving an empty panel in production. One test
also scrapes a real server's /metrics and finds every series the dashboard names that exists
without labels.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "voxgate.json"
#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}
_SERIES = re.compile(r"\b(voxgate_[a-z0-9_]+)\b(?:\{([^}]*)\})?")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def queries(dash: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and template variable queries."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def exported() -> dict[str, frozenset[str]]:
    """Series name -> label names, for every sample name the registry exposes."""
    series: dict[str, frozenset[str]] = {}
    for metric in vars(GatewayMetrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name, labels = metric._name, frozenset(metric._labelnames)
        kind = metric._type
        if kind == "counter":
            series[f"{name}_total"] = labels
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                series[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            series[name] = labels
    return series


@pytest.mark.unit
def test_every_queried_metric_and_label_exists_in_the_registry() -> None:
    known = exported()
    exprs = queries(dashboard())
    assert len(exprs) >= 30
    for expr in exprs:
        names = _SERIES.findall(expr)
        assert names, f"no voxgate metric in {expr!r}"
        allowed: set[str] = set(TARGET_LABELS)
        for name, matchers in names:
            assert name in known, f"{name} (in {expr!r}) is not exported by GatewayMetrics"
            allowed |= known[name]
            for label in _MATCHER.findall(matchers):
                assert label in known[name] | TARGET_LABELS, f"{name} has no label {label!r}"
        for group in _BY.findall(expr):
            for label in (g.strip() for g in group.split(",") if g.strip()):
                assert label in allowed, f"{expr!r} groups by {label!r}, which it does not have"


@pytest.mark.unit
def test_legends_name_only_labels_their_query_keeps() -> None:
    """A legend ``{{tenant}}`` over ``sum(...)`` without ``by (tenant)`` would print nothing."""
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if not re.match(r"\s*(sum|max|min|avg|histogram_quantile)\b", expr):
                continue  # not aggregated: every label survives
            kept = {g.strip() for group in _BY.findall(expr) for g in group.split(",")}
            for label in re.findall(r"\{\{(\w+)\}\}", target["legendFormat"]):
                assert label in kept, f"{panel['title']}: legend label {label!r} is aggregated away"


@pytest.mark.unit
def test_the_dashboard_is_well_formed_for_grafana() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance"} <= names
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], target["expr"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 (a loopback URL)
        body: bytes = reply.read()
    return body.decode()


@pytest.mark.e2e
async def test_unlabelled_series_the_dashboard_names_are_on_a_real_scrape() -> None:
    async with running_server(FakeToneHub(), server={"metrics_port": 0}) as srv:
        async with grpc.aio.insecure_channel(srv.target) as ch:
            rpc = pb_grpc.VoiceGatewayStub(ch).Converse()
            fmt = pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=16000)
            await rpc.write(pb.ConverseRequest(config=pb.SessionConfig(input_audio=fmt)))
            await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
            await rpc.done_writing()
            async for _ in rpc:
                pass
        url = f"http://{srv.config.server.metrics_host}:{srv.metrics_port}/metrics"
        text = await asyncio.to_thread(scrape, url)
    scraped = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    known = exported()
    wanted = {
        name
        for expr in queries(dashboard())
        for name, _ in _SERIES.findall(expr)
        if not (known[name] - {"le"})
    }
    assert wanted and wanted <= scraped, sorted(wanted - scraped)
