"""What reading an answer of Prometheus's query API costs (exporter/discovery/answercost.py):
told from its bytes before it is decoded, an upper bound of what reading it measures
(tracemalloc) in every shape, a fleet's answer under max_answer within its budget, and an
answer over the budget refused before any of it is decoded, through a real socket too."""
import gc
import json
import logging
import tracemalloc
from pathlib import Path

import pytest

from exporter.config.sections import load
from exporter.discovery import promseries
from exporter.discovery.answercost import AnswerTooCostly, decoded_budget, decoded_cost
from exporter.parse.names import SAMPLE_NAMES
from exporter.poll.poller import Poller
from exporter.serve.state import State

from test_promread import _compact, answer_of, read_config

PROLOGUE = '{"status":"success","data":{"resultType":"matrix","result":['
NAME = "vllm:prefix_cache_queries_total"


def _pod_body() -> str:
    """45 of the series the parser reads, from a real vLLM's /metrics."""
    text = (Path(__file__).parent / "fixtures/vllm-metrics/v1-0.32.0-cpu_tiny-llama_after-incident.txt").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    ours = [line for line in lines if line.split("{")[0].split(" ")[0] in SAMPLE_NAMES
            or line.split("{")[0].split(" ")[0].rsplit("_", 1)[0] in SAMPLE_NAMES]
    return "\n".join(ours[:45]) + "\n"


def fleet(pods: int, samples: int, wide: bool = False) -> bytes:
    """The answer Prometheus gives for `pods` pods of a PodMonitor, `samples` scrapes each."""
    body, result = _pod_body(), []
    for i in range(pods):
        labels = {"job": "llm/vllm", "namespace": "llm", "pod": f"vllm-{i:05d}", "instance": f"10.0.0.{i % 256}:8000",
                  "container": "vllm", "endpoint": "metrics"}
        result += answer_of({100.0 + 15 * k: body for k in range(samples)}, labels)["data"]["result"]
    if wide:
        result[0]["metric"]["namespace"] = "\U0001F600"  # one character over U+FFFF: the whole text 4 bytes a character
    return _compact({"status": "success", "data": {"resultType": "matrix", "result": result}}, ensure_ascii=not wide)


def _series(n: int, metric: str) -> bytes:
    return (PROLOGUE + ",".join('{"metric":{"__name__":"%s",%s},"values":[[1000,"1"]]}' % (NAME, metric % i)
                                for i in range(n)) + "]}}").encode()


SHAPES = {
    "fleet, 1 sample a series": lambda: fleet(30, 1),
    "fleet, 3 samples a series": lambda: fleet(30, 3),
    "fleet, 12 samples a series": lambda: fleet(20, 12),
    "fleet, one non-ASCII label": lambda: fleet(30, 3, wide=True),
    "one series of dense samples": lambda: (PROLOGUE + '{"metric":{"__name__":"%s","pod":"p","model_name":"m"},"values":[' % NAME
                                            + ",".join(f'[{1000 + i},"{i}"]' for i in range(30_000)) + "]}]}}").encode(),
    "a pod a series": lambda: _series(10_000, '"pod":"p%d","model_name":"m"'),
    "one pod, a label set a series": lambda: _series(10_000, '"pod":"p","model_name":"m%d"'),
    "decoded whole: empty lists": lambda: (PROLOGUE + '],"x":[' + ",".join(["[]"] * 100_000) + "]}}").encode(),
    "decoded whole: indented": lambda: json.dumps(json.loads(fleet(20, 3)), indent=1).encode(),
    "decoded whole: escaped": lambda: fleet(20, 3).replace(b'"vllm"', b'"vl\\u006cm"'),
}


def _peak_of(read) -> int:
    gc.collect()
    gc.disable()  # as the reader reads (PrometheusReader.fetch)
    tracemalloc.start()
    try:
        read()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        gc.enable()
    return peak


@pytest.mark.parametrize("shape", SHAPES)
def test_the_cost_told_from_the_bytes_bounds_what_reading_them_measures(shape):
    body = SHAPES[shape]()
    peak = _peak_of(lambda: promseries.pods_of_answer(body, "pod", "test", memo=promseries.PodMemo(), not_after=1e12))
    assert peak <= decoded_cost(body), (shape, len(body), peak, decoded_cost(body))


@pytest.mark.parametrize("samples", [1, 3, 12])
def test_a_fleets_answer_under_max_answer_is_within_its_budget(samples):
    """So the budget refuses no fleet's answer that max_answer lets through."""
    body = fleet(20, samples)
    assert decoded_cost(body) <= decoded_budget(len(body))
    assert promseries.pods_of_answer(body, "pod", "test", budget=decoded_budget(len(body)), not_after=1e12)


@pytest.mark.parametrize("shape", ["one series of dense samples", "a pod a series", "decoded whole: empty lists",
                                   "decoded whole: indented", "fleet, one non-ASCII label"])
def test_an_answer_over_its_budget_is_refused_before_any_of_it_is_decoded(shape):
    body = SHAPES[shape]()
    budget = decoded_budget(len(body) // 2)
    assert decoded_cost(body) > budget  # 20 times max_answer: over it at twice max_answer for each of these
    with pytest.raises(AnswerTooCostly) as refused:
        promseries.pods_of_answer(body, "pod", "test", budget=budget, partitions=2)
    said = str(refused.value)
    need = 2 * -(-decoded_cost(body) // budget)
    assert said.startswith(f"test: answer of {len(body)} bytes would cost up to") and f"partitions: {need} or more" in said
    peak = _peak_of(lambda: pytest.raises(AnswerTooCostly, promseries.pods_of_answer, body, "pod", "test", budget=budget))
    assert peak < 64 * 1024  # counted on the bytes: no text, list or dict of them made


def test_a_read_whose_answer_would_cost_over_its_budget_fails_said_and_counted_and_the_advice_reads(caplog):
    """Through the reader and a real socket: max_answer lets the answer's bytes through, its
    cost is over 20 times them; the read fails (the source's error, its failures counted, one
    log line) instead of growing the process; at the partitions the error names, it reads."""
    import re
    from urllib.parse import parse_qs, urlsplit

    from fakeserver import FakeServer, reply
    body = _series(500, '"pod":"p%d","model_name":"m","job":"vllm"')  # 500 pods of one series and sample: ~29 bytes a byte
    pods = json.loads(body)["data"]["result"]

    def query(h):
        asked = parse_qs(urlsplit(h.path).query)["query"][0]
        if not asked.startswith("{"):  # `up`: none here
            return reply(h, 200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
        part = re.search(r'pod(=~|!~)"\.\*\[([^\]]*)\]"', asked)
        kept = [s for s in pods if part is None or (s["metric"]["pod"][-1] in part[2]) == (part[1] == "=~")]
        reply(h, 200, _compact({"status": "success", "data": {"resultType": "matrix", "result": kept}}))

    max_answer = len(body)
    assert decoded_budget(max_answer) < decoded_cost(body) <= 2 * decoded_budget(max_answer)
    with FakeServer({"/api/v1/query": query}) as prom:
        raw = read_config(prom.base)
        raw["discovery"]["read_prometheus"]["max_answer"] = max_answer
        state = State()
        poller = Poller(load(raw), state, clock=lambda: 1010.0)
        poller.reader.stepped = 0.0
        try:
            with caplog.at_level(logging.WARNING):
                poller.read()
                poller.read()
            (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
            assert not source.ok and source.failures == 2 and "partitions: 2 or more" in source.error, source
            assert [r for r in caplog.records if "would cost up to" in r.getMessage()] and not state.targets()
        finally:
            poller.stop(0.5)
        raw["discovery"]["read_prometheus"]["partitions"] = 2
        state = State()
        poller = Poller(load(raw), state, clock=lambda: 1010.0)
        poller.reader.stepped = 0.0
        try:
            poller.read()
            (source,) = [s for s in state.published.discovery if s.name == "read_prometheus"]
            assert source.ok and len(state.targets()) == 500, source
        finally:
            poller.stop(0.5)
