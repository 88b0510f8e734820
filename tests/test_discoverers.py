"""Discovery sources against real files and HTTP servers on 127.0.0.1: a file_sd file
that appears, changes, breaks and goes; a Prometheus that answers, fails or is down."""
import json
import logging
import os

import pytest

from exporter.config import DiscoveryConfig, PrometheusSDConfig
from exporter.discoverers import FILE_SD, PROMETHEUS, Discovery

from conftest import FIXTURES, free_port
from fakeserver import FakeServer, reply, text

from test_poller import Clock

RECORDED = (FIXTURES / "discovery" / "prometheus-2.42-targets.json").read_text()


def group(*addresses, **labels):
    return {"targets": list(addresses), "labels": labels}


def write(path, groups, bump=0):
    path.write_text(json.dumps(groups))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))  # a distinct mtime on fast writes


def names(targets):
    return sorted(t.name for t in targets)


def test_file_sd_targets_come_change_and_go(tmp_path, caplog):
    sd = tmp_path / "vllm.json"
    write(sd, [group("127.0.0.1:1", pod="a"), group("127.0.0.1:2", pod="b")])
    clock = Clock()
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "*.json"),)), clock)
    assert names(d.refresh()) == ["a", "b"]
    write(sd, [group("127.0.0.1:1", pod="a"), group("127.0.0.1:3", pod="c")], bump=1)
    assert names(d.refresh()) == ["a", "c"]
    (tmp_path / "more.json").write_text(json.dumps([group("127.0.0.1:4", pod="d")]))
    assert names(d.refresh()) == ["a", "c", "d"]
    (tmp_path / "more.json").unlink()
    assert names(d.refresh()) == ["a", "c"]
    (state,) = d.snapshot()
    assert state.name == FILE_SD and state.ok and state.failures == 0


def test_a_malformed_file_sd_file_keeps_its_last_targets_and_says_so(tmp_path, caplog):
    sd = tmp_path / "vllm.yml"
    sd.write_text("- targets: ['127.0.0.1:1']\n  labels: {pod: a}\n")
    d = Discovery(DiscoveryConfig(file_sd=(str(sd),)), Clock())
    assert names(d.refresh()) == ["a"]
    with caplog.at_level(logging.WARNING):
        sd.write_text("- targets: ['127.0.0.1:1'\n")  # truncated mid-write
        os.utime(sd, ns=(0, sd.stat().st_mtime_ns + 1_000_000_000))
        assert names(d.refresh()) == ["a"]
    (state,) = d.snapshot()
    assert not state.ok and state.failures == 1 and "not valid YAML" in state.error
    assert "not valid YAML" in caplog.text and "keeping the last 1 target" in caplog.text
    sd.write_text("- targets: ['127.0.0.1:1', '127.0.0.1:2']\n")
    assert len(d.refresh()) == 2 and d.snapshot()[0].ok


def test_no_file_matching_is_an_error_not_a_crash(tmp_path):
    d = Discovery(DiscoveryConfig(file_sd=(str(tmp_path / "none-*.json"),)), Clock())
    assert d.refresh() == []
    (state,) = d.snapshot()
    assert not state.ok and "no file matches" in state.error


def prometheus_config(url, job="vllm"):
    return DiscoveryConfig(prometheus=PrometheusSDConfig(url=url, job=job, timeout=2.0))


def test_targets_from_a_prometheus_and_its_outage_keeps_them(caplog):
    answer = {"body": RECORDED, "status": 200}
    seen = []

    def route(h):
        seen.append(h.path)
        reply(h, answer["status"], answer["body"].encode(), [("Content-Type", "application/json"), ("Connection", "close")])
        h.close_connection = True  # so that the outage below is one

    with FakeServer({"/api/v1/targets": route}) as server:
        d = Discovery(prometheus_config(server.base), Clock())
        assert len(d.refresh()) == 3
        assert "state=active" in seen[0] and "scrapePool=vllm" in seen[0]
        with caplog.at_level(logging.WARNING):
            answer.update(status=503, body="{}")
            assert len(d.refresh()) == 3
            answer.update(status=200, body="<html>not json</html>")
            assert len(d.refresh()) == 3
        (state,) = d.snapshot()
        assert state.name == PROMETHEUS and not state.ok and state.failures == 2 and "not JSON" in state.error
        assert "HTTP 503" in caplog.text
    # the Prometheus is gone altogether
    assert len(d.refresh()) == 3
    assert "unreachable" in d.snapshot()[0].error and d.snapshot()[0].failures == 3


def test_an_unreachable_prometheus_from_the_start_is_an_error_and_no_targets():
    d = Discovery(prometheus_config(f"http://127.0.0.1:{free_port()}"), Clock())
    assert d.refresh() == []
    assert "unreachable" in d.snapshot()[0].error


@pytest.mark.parametrize("route", [
    pytest.param(text('{"status": "success", "data": {"activeTargets": [{"labels": {"job": "vllm"}}]}}'), id="target-without-address"),
    pytest.param(text('{"status": "error", "errorType": "bad_data", "error": "x"}'), id="error-answer"),
])
def test_a_bad_targets_answer_is_a_failure(route):
    with FakeServer({"/api/v1/targets": route}) as server:
        d = Discovery(prometheus_config(server.base), Clock())
        assert d.refresh() == [] and not d.snapshot()[0].ok


def test_basic_auth_and_bearer_token_are_sent():
    got = []

    def route(h):
        got.append(h.headers.get("Authorization"))
        reply(h, 200, RECORDED.encode())

    with FakeServer({"/api/v1/targets": route}) as server:
        Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", bearer_token="tok")), Clock()).refresh()
        Discovery(DiscoveryConfig(prometheus=PrometheusSDConfig(url=server.base, job="vllm", username="u", password="p")), Clock()).refresh()
    assert got == ["Bearer tok", "Basic dTpw"]
