"""`diagnose`: a fixture for each culprit kind, online (against the simulator's vLLM
/tokenize and /detokenize) and offline."""
import json
import subprocess
import sys

import pytest

from exporter.sim import simulator
from exporter.sim.server import Fleet
from exporter.tools import divergence
from exporter.tools.diagnose import diagnose_requests
from exporter.tools.divergence import first_divergence, reusable_blocks

from conftest import FIXTURES, free_port

PROMPTS = FIXTURES / "prompts"
KINDS = ["timestamp", "uuid", "request_id", "user_name_or_tier", "tools_order", "retrieved_text_before_instructions"]


def pair(kind):
    return (json.loads((PROMPTS / kind / "a.json").read_text()), json.loads((PROMPTS / kind / "b.json").read_text()))


@pytest.fixture(scope="module")
def vllm():
    replica = simulator.Replica("vllm", simulator.Scenario(), start=0.0, seed=1)
    fleet = Fleet([replica], clock=lambda: 1.0).start()
    yield fleet
    fleet.stop()


@pytest.mark.parametrize("a, b, expected", [
    pytest.param([1, 2, 3], [1, 2, 4], 2, id="differs"),
    pytest.param([1, 2], [1, 2, 3], 2, id="prefix"),
    pytest.param([], [1], 0, id="empty"),
    pytest.param([5], [6], 0, id="first"),
])
def test_first_divergence(a, b, expected):
    assert first_divergence(a, b) == expected


@pytest.mark.parametrize("d, n, blocks", [
    pytest.param(40, 100, (2, 6), id="two-blocks-survive"),
    pytest.param(100, 100, (6, 6), id="identical-long"),
    pytest.param(64, 64, (3, 4), id="identical-whole-blocks-last-recomputed"),
    pytest.param(10, 12, (0, 0), id="shorter-than-a-block"),
])
def test_reusable_blocks_follow_vllm(d, n, blocks):
    assert reusable_blocks(d, n, 16) == blocks


@pytest.mark.parametrize("kind", KINDS)
def test_online_names_the_culprit(vllm, kind):
    a, b = pair(kind)
    f = diagnose_requests(a, b, vllm.url("vllm"), None, offline=False)
    assert kind in f.culprits
    assert not f.approximate and f.block_size == 16  # read from cache_config_info
    assert f.reusable_blocks < f.total_blocks
    assert f.context_a != f.context_b
    tokenized = [body for _, endpoint, body in vllm.received if endpoint == "tokenize"]
    assert tokenized[-1]["add_generation_prompt"] is True and tokenized[-1]["messages"] == b["messages"]


@pytest.mark.parametrize("kind", KINDS)
def test_offline_names_the_culprit_and_says_it_approximates(kind):
    a, b = pair(kind)
    f = diagnose_requests(a, b, None, 16, offline=True)
    assert kind in f.culprits and f.approximate
    assert "APPROXIMATION" in divergence.report(f)


def test_identical_requests_share_all_but_the_last_block(vllm):
    a, _ = pair("timestamp")
    f = diagnose_requests(a, a, vllm.url("vllm"), 16, offline=False)
    assert f.first_divergence == f.tokens_a and f.culprits == ()
    assert f.reusable_blocks == (f.tokens_b - 1) // 16


def run(*args):
    return subprocess.run([sys.executable, "-m", "exporter", *args], capture_output=True, text=True, timeout=60)


def test_cli_json_output(vllm):
    out = run("diagnose", str(PROMPTS / "uuid" / "a.json"), str(PROMPTS / "uuid" / "b.json"), "--target", vllm.url("vllm"), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert "uuid" in data["culprits"] and data["reusable_blocks"] < data["total_blocks"] and data["advice"]


def test_cli_text_output_reports_k_of_n(vllm):
    out = run("diagnose", str(PROMPTS / "timestamp" / "a.json"), str(PROMPTS / "timestamp" / "b.json"), "--target", vllm.url("vllm") + "/metrics")
    assert out.returncode == 0 and "reusable blocks: " in out.stdout and " of " in out.stdout and "timestamp" in out.stdout


@pytest.mark.parametrize("args, code, fragment", [
    pytest.param(["a.json", "b.json"], 2, "--target", id="no-target-no-offline"),
    pytest.param(["/nonexistent.json", "/nonexistent.json", "--offline"], 2, "cannot read", id="missing-file"),
    pytest.param([str(PROMPTS / "lint" / "good.j2"), str(PROMPTS / "lint" / "good.j2"), "--offline"], 2, "not JSON", id="not-json"),
])
def test_cli_bad_input(args, code, fragment):
    out = run("diagnose", *args)
    assert out.returncode == code and fragment in out.stderr


def test_cli_dead_target_is_a_clear_error():
    out = run("diagnose", str(PROMPTS / "uuid" / "a.json"), str(PROMPTS / "uuid" / "b.json"), "--target", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1 and "ConnectionError" in out.stderr
