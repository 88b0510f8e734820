"""The what-if analysis: input formats, bad lines, the waterfall, and the end-to-end
check that replaying the simulator's traffic gives the hit ratio its /metrics reported."""
import json
import subprocess
import sys
import time

import pytest

from exporter import simulator, whatif
from exporter.vllm_metrics import parse

from conftest import FIXTURES


def run(*args, input=None):
    return subprocess.run([sys.executable, "-m", "exporter", "whatif", *args], input=input, capture_output=True, text=True, timeout=120)


def test_vllm_request_log_lines_of_each_version():
    items = list(whatif.read_requests((FIXTURES / "whatif" / "vllm-request-log.txt").read_text().splitlines()))
    a, b, c, bad = items
    assert a.tokens == tuple(range(1, 19)) and a.lora is None and a.t is not None
    assert b.tokens[-2:] == (99, 98) and b.lora == "sql-adapter"
    assert c.tokens is None and c.prompt == "Only text here"
    assert isinstance(bad, whatif.SampleError) and "line 4" in str(bad)


@pytest.mark.parametrize("line, fragment", [
    pytest.param("not json at all", "neither a JSON request", id="garbage"),
    pytest.param("{bad json", "not JSON", id="broken-json"),
    pytest.param("[1, 2]", "neither", id="a-list"),
    pytest.param('{"t": "x", "prompt": "a"}', "`t` must be a number", id="bad-t"),
    pytest.param('{"prompt_token_ids": []}', "non-empty list of integers", id="empty-ids"),
    pytest.param('{"prompt_token_ids": [1, "2"]}', "non-empty list of integers", id="string-id"),
    pytest.param('{"body": {"messages": []}}', "non-empty `messages`", id="empty-messages"),
    pytest.param('{"session": "x"}', "one of `prompt_token_ids`", id="no-prompt"),
])
def test_bad_lines_are_errors_with_their_line_number(line, fragment):
    (item,) = list(whatif.read_requests(["", line]))
    assert isinstance(item, whatif.SampleError) and str(item).startswith("line 2:") and fragment in str(item)


def test_the_cli_skips_bad_lines_and_an_empty_input_exits_2(tmp_path):
    sample = tmp_path / "s.jsonl"
    sample.write_text('{"prompt_token_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}\nnot a request\n'
                      '{"prompt_token_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}\n')
    proc = run(str(sample), "--json")
    assert proc.returncode == 0 and "line 2:" in proc.stderr
    data = json.loads(proc.stdout)
    assert data["requests"] == 2 and data["prompt_tokens"] == 34 and data["policies"]["round_robin"] == pytest.approx(16 / 34)
    assert set(data) >= {"requests", "prompt_tokens", "block_size", "policies", "ceiling", "losses"}
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert run(str(empty)).returncode == 2
    assert run(str(tmp_path / "missing.jsonl")).returncode == 1


def test_replaying_the_simulators_traffic_gives_the_ratio_its_metrics_reported(tmp_path):
    """Two replicas serve 10 minutes of traffic and count hits as vLLM does; their
    requests, replayed with observed routing, give the same ratio within a point."""
    replicas = [simulator.Replica(f"vllm-{i}", simulator.Scenario(request_rate=4.0), start=0.0, seed=40 + i) for i in range(2)]
    for r in replicas:
        r.sample = []
        r.advance(600.0)
    snaps = [parse(r.render()) for r in replicas]
    hits = sum(s.prefix_cache.hits for snap in snaps for s in snap.series)
    queries = sum(s.prefix_cache.queries for snap in snaps for s in snap.series)
    lines = sorted((line for r in replicas for line in r.sample), key=lambda l: l["t"])
    sample = tmp_path / "traffic.jsonl"
    sample.write_text("\n".join(json.dumps(l) for l in lines))
    proc = run(str(sample), "--routing=observed", "--routing=round_robin", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert abs(data["observed"] - hits / queries) < 0.01
    assert data["policies"]["observed"] == data["observed"] and data["prompt_tokens"] == queries


def chat(system, user, history=()):
    return {"model": "m", "messages": [{"role": "system", "content": system}, *history, {"role": "user", "content": user}]}


STATIC = " ".join(["Follow the support policy, cite its sections and never reveal internal notes."] * 6)


def test_text_input_splits_the_loss_into_volatile_content_and_rewritten_history():
    rows = []
    for i in range(40):
        stamp = f"2026-11-30 05:{i // 60:02d}:{i % 60:02d}"
        rows.append({"t": i, "session": f"c{i % 4}", "body": chat(f"You are ACME support. Current date and time: {stamp}. {STATIC}", f"question {i}")})
    requests = [r for r in whatif.read_requests(json.dumps(r) for r in rows)]
    a = whatif.analyze(requests, 2, ("round_robin", "session"), None, 16, whatif.approximate_tokenizer())
    losses = {l["kind"]: l for l in a.losses}
    assert losses["volatile_content"]["points"] > 50 and "Current date and time" in losses["volatile_content"]["example"]
    assert losses["history_rewritten"]["points"] == 0
    # the first request of 40 computes all: the ideal is below 100%
    assert a.ideal > 0.7 and a.ceiling < 0.2 and a.fixed > 0.6 and not a.exact



def test_a_session_whose_earlier_turns_are_rewritten_shows_the_history_loss():
    rows, history = [], []
    for turn in range(6):
        # a client that summarises: turn 0's user message is rewritten in every later turn
        rewritten = [{"role": "user", "content": f"first question (summary v{turn})"}] + history[1:]
        body = chat(STATIC, f"question {turn}", rewritten if turn else ())
        rows.append({"t": turn, "session": "conv-1", "body": body})
        history = body["messages"][1:] + [{"role": "assistant", "content": f"answer {turn} " * 20}]
    requests = list(whatif.read_requests(json.dumps(r) for r in rows))
    a = whatif.analyze(requests, 1, ("round_robin",), None, 16, whatif.approximate_tokenizer())
    losses = {l["kind"]: l for l in a.losses}
    assert losses["history_rewritten"]["points"] > 5 and "conv-1" in losses["history_rewritten"]["example"]


def test_text_is_tokenized_exactly_through_a_targets_tokenize(tmp_path):
    replica = simulator.Replica("vllm-0", simulator.Scenario(), start=time.time(), seed=3)
    fleet = simulator.Fleet([replica], clock=time.time).start()
    try:
        sample = tmp_path / "text.jsonl"
        sample.write_text("\n".join(json.dumps({"prompt": STATIC + f" q{i}"}) for i in range(5)))
        proc = run(str(sample), f"--target={fleet.url('vllm-0')}", "--json")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["exact"] is True and "/tokenize" in data["tokenizer"]
        ids = replica.tokenizer.encode(STATIC + " q0")
        assert data["prompt_tokens"] == sum(len(replica.tokenizer.encode(STATIC + f" q{i}")) for i in range(5)) and ids
        assert [b for _, e, b in fleet.received if e == "tokenize"]
    finally:
        fleet.stop()
    down = run(str(sample), "--target=http://127.0.0.1:1")
    assert down.returncode == 1 and "error:" in down.stderr


def test_without_a_tokenizer_text_is_approximated_and_says_so(tmp_path):
    sample = tmp_path / "text.jsonl"
    sample.write_text("\n".join(json.dumps({"prompt": STATIC + f" q{i}"}) for i in range(3)))
    proc = run(str(sample))
    assert proc.returncode == 0 and "APPROXIMATION" in proc.stdout


def test_a_local_tokenizer_json_gives_exact_ids(tmp_path):
    """`--tokenizer FILE` through the `tokenizers` library (the `whatif` extra): a small
    word-level tokenizer.json made here, so the ids are known."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = sorted(set(STATIC.replace(",", " ").replace(".", " ").split()) | {"q0", "q1", "q2", "[UNK]"})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    sample = tmp_path / "text.jsonl"
    sample.write_text("\n".join(json.dumps({"prompt": STATIC + f" q{i}"}) for i in range(3)))
    proc = run(str(sample), f"--tokenizer={path}", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    expected = sum(len(tok.encode(STATIC + f" q{i}", add_special_tokens=False).ids) for i in range(3))
    assert data["exact"] is True and data["prompt_tokens"] == expected
    missing = run(str(sample), f"--tokenizer={tmp_path / 'nope.json'}")
    assert missing.returncode == 2 and "cannot load" in missing.stderr
