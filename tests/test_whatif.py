"""The what-if analysis: the waterfall, block-hash traces (Mooncake's and Qwen-Bailian's)
against replays written here, the stampede, and the end-to-end check that replaying the
simulator's traffic gives the hit ratio its /metrics reported (reading the lines:
tests/test_whatif_input.py)."""
import argparse
import json
import math
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zlib

import pytest

from exporter.sim import simulator
from exporter.sim.server import Fleet
from exporter.tools import whatif, whatif_command
from exporter.parse.vllm_metrics import parse

from conftest import FIXTURES


def run(*args, input=None):
    return subprocess.run([sys.executable, "-m", "exporter", "whatif", *args], input=input, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_text_is_tokenized_exactly_through_a_targets_tokenize(tmp_path):
    replica = simulator.Replica("vllm-0", simulator.Scenario(), start=time.time(), seed=3)
    fleet = Fleet([replica], clock=time.time).start()
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


# --- block-hash traces (Mooncake's FAST'25 format) ----------------------------------------------
MOONCAKE = FIXTURES / "mooncake" / "conversation_trace_head400.jsonl"


def mooncake_requests():
    items = list(whatif.read_requests(MOONCAKE.read_text().splitlines()))
    assert all(isinstance(i, whatif.Request) and i.is_hashes for i in items) and len(items) == 400
    return items


def test_the_unlimited_single_replica_ratio_of_a_mooncake_trace_is_the_count_of_leading_ids_seen_before():
    """Counted here without the model: in timestamp order, a request hits the longest run
    of its leading full-block ids that earlier requests held, never its last token."""
    rows = sorted((json.loads(line) for line in MOONCAKE.read_text().splitlines()), key=lambda r: r["timestamp"])
    seen, hit, total = set(), 0, 0
    for row in rows:
        n = row["input_length"]
        ids = row["hash_ids"][: n // 512]
        run = 0
        while run < len(ids) and ids[run] in seen:
            run += 1
        hit += min(run, (n - 1) // 512) * 512
        total += n
        seen.update(ids)
    a = whatif.analyze(mooncake_requests(), 1, ("round_robin",), None, 512)
    assert a.prompt_tokens == total and hit > 0
    assert a.ceiling == a.policies["round_robin"] == hit / total
    spread = whatif.analyze(mooncake_requests(), 4, ("round_robin",), None, 512)
    assert 0 < spread.policies["round_robin"] < a.ceiling


def test_the_replay_follows_the_timestamps_not_the_line_order():
    lines = MOONCAKE.read_text().splitlines()
    # requests of the same millisecond keep the order of their lines: cut between two stamps
    stamps = [json.loads(line)["timestamp"] for line in lines]
    cut = next(i for i in range(200, len(lines)) if stamps[i] != stamps[i - 1])
    shuffled = lines[cut:] + lines[:cut]
    parse = lambda ls: [r for r in whatif.read_requests(ls)]
    assert whatif.analyze(parse(shuffled), 4, ("round_robin",), 20_000, 512).policies == \
        whatif.analyze(parse(lines), 4, ("round_robin",), 20_000, 512).policies


def test_a_block_hash_trace_on_the_command_line(tmp_path):
    svg = tmp_path / "curve.svg"
    proc = run(str(MOONCAKE), "--block-size=512", "--replicas=4", "--cache-tokens=1000000", "--svg", str(svg), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"requests", "prompt_tokens", "block_size", "policies", "ceiling", "losses"}
    assert data["input"] == "block_hashes" and data["block_size"] == 512 and data["cache_blocks"] == 1_000_000 // 512
    # no session key in the trace: session routing is left out, and said so
    assert set(data["policies"]) == {"round_robin", "random", "prefix_hash"}
    assert any("no session key" in note for note in data["notes"])
    losses = {l["kind"]: l for l in data["losses"]}
    for kind in ("volatile_content", "history_rewritten"):
        assert losses[kind]["points"] is None and losses[kind]["available"] is False  # unknown, never zero
    curve = data["capacity_curve"]
    assert curve["sizes_tokens"][0] == 100_000 and curve["sizes_tokens"][-2] == 10 ** 9 and curve["sizes_tokens"][-1] is None
    for policy, ratios in curve["policies"].items():
        assert ratios == sorted(ratios), policy  # more cache never hits less
        assert ratios[-1] >= ratios[0] and 0 <= ratios[0] and ratios[-1] <= 1
        reach = curve["reaches_90_percent"][policy]
        assert ratios[curve["sizes_tokens"].index(reach)] >= 0.9 * ratios[-1]
    assert curve["configured_tokens"] == (1_000_000 // 512) * 512
    assert svg.read_text().startswith("<svg")
    text = run(str(MOONCAKE), "--block-size=512", "--capacity-curve")
    assert text.returncode == 0, text.stderr
    assert "Mooncake's FAST'25 traces use 512" in text.stdout and "not available" in text.stdout
    assert "90% of the unlimited ratio from" in text.stdout and "session routing left out" in text.stdout


def test_the_curve_at_the_configured_size_is_the_ratio_the_policies_get():
    a = whatif.analyze(mooncake_requests(), 4, ("round_robin", "prefix_hash"), None, 512, cache_tokens=10 ** 6, curve=True)
    sizes = a.curve["sizes_tokens"]
    at = sizes.index(10 ** 6)
    b = whatif.analyze(mooncake_requests(), 4, ("round_robin", "prefix_hash"), 10 ** 6 // 512, 512)
    assert a.policies == b.policies
    for policy in ("round_robin", "prefix_hash"):
        assert a.curve["policies"][policy][at] == a.policies[policy]


@pytest.mark.parametrize("args, fragment", [
    pytest.param((), "needs --block-size", id="no-block-size"),
    pytest.param(("--block-size=512", "--routing=session"), "session routing needs a session key", id="session"),
    pytest.param(("--block-size=512", "--cache-tokens=100"), "holds no block", id="cache-smaller-than-a-block"),
    pytest.param(("--block-size=512", "--cache-tokens=1000", "--cache-blocks=2"), "not allowed with", id="tokens-and-blocks"),
])
def test_a_block_hash_trace_without_what_it_needs_is_a_usage_error(args, fragment):
    proc = run(str(MOONCAKE), *args)
    assert proc.returncode == 2 and fragment in proc.stderr


def test_a_sample_mixing_hash_lines_and_requests_names_the_first_odd_line(tmp_path):
    lines = MOONCAKE.read_text().splitlines()[:3]
    sample = tmp_path / "mixed.jsonl"
    sample.write_text("\n".join(lines[:2] + ['{"prompt_token_ids": [1, 2, 3]}'] + lines[2:] + ['{"prompt": "hi"}']) + "\n")
    proc = run(str(sample), "--block-size=512")
    assert proc.returncode == 2 and "line 3: token ids or text in a sample of block hashes" in proc.stderr


def test_a_block_size_the_hash_ids_do_not_fit_is_warned_about():
    a = whatif.analyze(mooncake_requests(), 1, ("round_robin",), None, 16)
    assert any("does not fit input_length at 16 tokens a hash id" in note and "line 1" in note for note in a.notes)
    assert not any("does not fit" in note for note in whatif.analyze(mooncake_requests(), 1, ("round_robin",), None, 512).notes)


@pytest.mark.parametrize("length, ids, second_hit", [
    pytest.param(1024, [1, 2], 512, id="whole-blocks-the-last-token-is-computed"),
    pytest.param(1000, [1, 2], 512, id="the-partial-last-block-is-never-cached"),
    pytest.param(1025, [1, 2, 3], 1024, id="two-full-blocks-and-one-token"),
    pytest.param(400, [1], 0, id="shorter-than-a-block"),
])
def test_a_repeated_block_hash_request_hits_its_full_blocks_but_never_the_last_token(length, ids, second_hit):
    line = json.dumps({"timestamp": 0, "input_length": length, "hash_ids": ids})
    a = whatif.analyze(list(whatif.read_requests([line, line])), 1, ("round_robin",), None, 512)
    assert a.prompt_tokens == 2 * length and a.ceiling == second_hit / (2 * length)


# --- Qwen-Bailian traces: sessions on a shared trace -------------------------------------------------
BAILIAN = FIXTURES / "bailian" / "qwen_bailian_synthetic.jsonl"


def bailian_rows():
    rows = [json.loads(line) for line in BAILIAN.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["timestamp"])  # Python's sort is stable, as the replay's order is


def bailian_requests():
    items = list(whatif.read_requests(BAILIAN.read_text().splitlines()))
    assert all(isinstance(i, whatif.Request) and i.is_hashes for i in items)
    return items


def replay_by_hand(rows, replicas, replica_of, rate=math.inf):
    """The token-weighted hit ratio, counted here without the module: a trie of the ids
    gives each prefix of blocks its own node; a replica holds nodes from the time the
    prefill that computed them ends; a request hits its longest held run of full blocks,
    never its last token."""
    trie, held = {}, [{} for _ in range(replicas)]
    hit = total = 0
    for i, row in enumerate(rows):
        n, t = row["input_length"], row["timestamp"]
        nodes, parent = [], -1
        for block in row["hash_ids"][: n // 16]:
            parent = trie.setdefault((parent, block), len(trie))
            nodes.append(parent)
        ready = held[replica_of(i, row)]
        run = 0
        while run < len(nodes) and ready.get(nodes[run], math.inf) <= t:
            run += 1
        h = min(run, (n - 1) // 16) * 16
        done = t + (n - h) / rate
        for node in nodes:
            ready[node] = min(ready.get(node, math.inf), done)
        hit += h
        total += n
    return hit / total


def conversation_of(rows):
    """Each chat's first turn, following parent_chat_id by hand."""
    parent = {r["chat_id"]: r["parent_chat_id"] for r in rows}
    def root(chat):
        for _ in range(len(rows)):
            if parent.get(chat, -1) == -1:
                return chat
            chat = parent[chat]
        raise AssertionError("a loop of parents in the fixture")
    return root


@pytest.mark.parametrize("rate", [math.inf, 8000.0], ids=["prefill-not-timed", "8000-tokens-a-second"])
def test_a_bailian_trace_gives_the_ratios_of_a_replay_by_hand(rate):
    rows, root = bailian_rows(), conversation_of(bailian_rows())
    a = whatif.analyze(bailian_requests(), 4, ("round_robin", "session"), None, None, prefill_tokens_per_s=rate)
    assert a.block_size == 16 and a.trace_format == "qwen_bailian" and a.requests == len(rows)
    assert a.prompt_tokens == sum(r["input_length"] for r in rows)
    assert a.ceiling == replay_by_hand(rows, 1, lambda i, row: 0)
    assert a.policies["round_robin"] == replay_by_hand(rows, 4, lambda i, row: i % 4, rate)
    # session affinity on the conversation: the root chat's id, as text
    assert a.policies["session"] == replay_by_hand(rows, 4, lambda i, row: zlib.crc32(str(root(row["chat_id"])).encode()) % 4, rate)
    assert a.policies["round_robin"] < a.policies["session"] < a.ceiling


def test_the_per_block_ids_of_a_bailian_trace_are_not_matched_behind_another_prefix():
    """The fixture's search requests open their message with the same 64-token header
    behind different system prompts: taken as they are, its ids would match there."""
    rows = bailian_rows()
    seen, naive = set(), 0
    for row in rows:
        ids = row["hash_ids"][: row["input_length"] // 16]
        run = 0
        while run < len(ids) and ids[run] in seen:
            run += 1
        naive += min(run, (row["input_length"] - 1) // 16) * 16
        seen.update(ids)
    a = whatif.analyze(bailian_requests(), 1, ("round_robin",), None, None)
    assert naive / a.prompt_tokens > a.ceiling == replay_by_hand(rows, 1, lambda i, row: 0)


def test_a_bailian_trace_says_its_block_size_and_a_given_one_overrides_it():
    a = whatif.analyze(bailian_requests(), 1, ("round_robin",), None, None)
    assert a.block_size == 16 and not any("does not fit" in note for note in a.notes)
    assert any("conversation(s), each the root of its chat_id chain" in note for note in a.notes)
    b = whatif.analyze(bailian_requests(), 1, ("round_robin",), None, 32)
    assert b.block_size == 32 and any("does not fit input_length at 32 tokens" in note for note in b.notes)


def test_a_bailian_trace_on_the_command_line(tmp_path):
    proc = run(str(BAILIAN), "--replicas=4", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"requests", "prompt_tokens", "block_size", "policies", "ceiling", "losses", "prefix_groups"}
    assert data["input"] == "block_hashes" and data["trace_format"] == "qwen_bailian" and data["block_size"] == 16
    assert set(data["policies"]) == {"round_robin", "random", "session", "prefix_hash"}
    assert data["prefill_tokens_per_s"] == whatif.DEFAULT_PREFILL_TOKENS_PER_S
    losses = {l["kind"]: l for l in data["losses"]}
    assert losses["stampede"]["points"] > 0 and "gateway" in losses["stampede"]["fix"]  # the fixture holds a burst
    points = sum(l["points"] for l in data["losses"] if l["points"] is not None)
    assert round(data["ceiling"] * 100 - points, 1) == round(data["policies"]["round_robin"] * 100, 1)
    assert {g["type"] for g in data["by_type"]} == {"text", "search", "image", "file"}
    assert sum(g["requests"] for g in data["by_turn"]) == data["requests"]
    svg = tmp_path / "curve.svg"
    text = run(str(BAILIAN), "--replicas=4", f"--svg={svg}")
    assert text.returncode == 0, text.stderr
    assert "stampede (blocks still in another's prefill)" in text.stdout and "prefix groups:" in text.stdout
    assert "session" in text.stdout.split("capacity curve:")[1].splitlines()[1]
    lines = ET.fromstring(svg.read_text()).findall("{http://www.w3.org/2000/svg}polyline")
    assert "session" in [l.get("data-policy") for l in lines]


def test_a_line_in_the_other_trace_format_is_refused(tmp_path):
    sample = tmp_path / "mixed.jsonl"
    sample.write_text("\n".join(BAILIAN.read_text().splitlines()[:2] + MOONCAKE.read_text().splitlines()[:1]) + "\n")
    proc = run(str(sample))
    assert proc.returncode == 2
    assert "line 3: a line in Mooncake's FAST'25 format in a trace in the Qwen-Bailian format (line 1)" in proc.stderr


# --- the stampede: blocks still in another request's prefill -------------------------------------------
def burst_sample(count=30, prefix=2000, own=50, within=0.2):
    """`count` requests opening with one new `prefix`-token system prompt, `own` tokens each
    of their own, arriving within `within` s, then one more a second later."""
    shared = list(range(prefix))
    rows = [{"t": 100 + within * i / count, "prompt_token_ids": shared + [10 ** 6 + i * own + k for k in range(own)]} for i in range(count)]
    rows.append({"t": 101.5, "prompt_token_ids": shared + [2 * 10 ** 6 + k for k in range(own)]})
    return list(whatif.read_requests(json.dumps(r) for r in rows))


def test_a_burst_within_one_prefill_loses_the_stampedes_tokens_and_nothing_without_prefill_time():
    requests = burst_sample()
    total = 31 * 2050
    assert requests[-2].t - requests[0].t < 2050 / 8000  # all 30 arrive before the first prefill ends
    timed = whatif.analyze(requests, 1, ("round_robin",), None, 16, prefill_tokens_per_s=8000)
    instant = whatif.analyze(requests, 1, ("round_robin",), None, 16, prefill_tokens_per_s=math.inf)
    assert timed.ceiling == instant.ceiling == 30 * 2000 / total  # the ceiling is the replay without prefill time
    assert instant.policies["round_robin"] == 30 * 2000 / total
    assert timed.policies["round_robin"] == 2000 / total  # only the request after the burst hits
    stampede = {l["kind"]: l for l in timed.losses}["stampede"]
    assert stampede["points"] == round(29 * 2000 / total * 100, 2)
    assert "29 request(s)" in stampede["example"] and "gateway" in stampede["fix"]
    assert {l["kind"]: l for l in instant.losses}["stampede"]["points"] == 0
    assert "stampede" in whatif.report(timed) and json.dumps(timed.to_json(), allow_nan=False)
    assert instant.to_json()["prefill_tokens_per_s"] is None and timed.to_json()["prefill_tokens_per_s"] == 8000


def test_spreading_a_burst_over_replicas_does_not_cure_it():
    """Round robin puts the burst on 4 replicas; on each, its requests arrive inside the
    prefill of the first one there, so each replica loses its own followers."""
    requests = burst_sample()
    a = whatif.analyze(requests, 4, ("round_robin",), None, 16, prefill_tokens_per_s=8000)
    losses = {l["kind"]: l["points"] for l in a.losses}
    total = 31 * 2050
    assert losses["routing"] == round(3 * 2000 / total * 100, 2)  # 4 first requests miss, not 1
    assert losses["stampede"] == round(26 * 2000 / total * 100, 2)  # the other 26 of the burst miss too


def test_without_arrival_times_the_stampede_is_not_measured_and_says_so():
    rows = [{"prompt_token_ids": list(range(2050))}] * 3
    a = whatif.analyze(list(whatif.read_requests(json.dumps(r) for r in rows)), 1, ("round_robin",), None, 16, prefill_tokens_per_s=8000)
    stampede = {l["kind"]: l for l in a.losses}["stampede"]
    assert stampede["points"] is None and stampede["available"] is False and "arrival time" in stampede["why"]
    assert any("stampede not measured" in note for note in a.notes)
    assert "not available" in whatif.report(a)


@pytest.mark.parametrize("rate", [-1.0, 0.0, float("nan"), True], ids=["negative", "zero", "nan", "bool"])
def test_a_prefill_rate_that_is_no_rate_is_refused(rate):
    with pytest.raises(whatif.SampleError, match="the prefill rate must be a positive number"):
        whatif.analyze(burst_sample(), 1, ("round_robin",), None, 16, prefill_tokens_per_s=rate)


@pytest.mark.parametrize("value, fragment", [
    pytest.param("-8000", "must be a positive number", id="negative"),
    pytest.param("nan", "must be a positive number", id="nan"),
    pytest.param("0", "must be a positive number", id="zero"),
    pytest.param("fast", "is not a number", id="a-word"),
])
def test_the_prefill_flag_is_a_usage_error_when_it_is_no_rate(value, fragment, capsys):
    parser = argparse.ArgumentParser()
    whatif_command.add_arguments(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([f"--prefill-tokens-per-s={value}"])
    assert exit_.value.code == 2 and fragment in capsys.readouterr().err


def test_the_prefill_flag_takes_inf_and_has_its_stated_default():
    parser = argparse.ArgumentParser()
    whatif_command.add_arguments(parser)
    assert parser.parse_args(["--prefill-tokens-per-s=inf"]).prefill_tokens_per_s == math.inf
    assert parser.parse_args(["--prefill-tokens-per-s", "12000"]).prefill_tokens_per_s == 12000.0
    assert parser.parse_args([]).prefill_tokens_per_s == whatif.DEFAULT_PREFILL_TOKENS_PER_S == 8000
