"""The vLLM client of `diagnose` and `whatif`: never shows a password, and answers within
its deadline whatever the server does."""
import time

import pytest

from exporter.cli import main
from exporter.tools.vllm_client import VLLMClient, VLLMError

from conftest import FIXTURES, free_port
from fakeserver import FakeServer, MisbehavingServer, reply

PROMPTS = FIXTURES / "prompts"


def with_password(base: str) -> str:
    return base.replace("http://", "http://alice:s3cret@")


def test_an_error_names_the_server_without_its_password():
    with FakeServer({"/tokenize": lambda h: reply(h, 500, b"boom")}) as server:
        with pytest.raises(VLLMError) as err:
            VLLMClient(with_password(server.base)).tokenize_text("hi")
        assert str(err.value) == server.base.replace("http://", "http://alice:xxxxx@") + "/tokenize: HTTP 500: boom"
        seen = server.requests[-1][2].get("Authorization")
    assert seen == "Basic YWxpY2U6czNjcmV0"  # the password is still sent, only never shown


def test_diagnose_prints_no_password(capsys):
    url = with_password(f"http://127.0.0.1:{free_port()}")
    code = main(["diagnose", str(PROMPTS / "uuid" / "a.json"), str(PROMPTS / "uuid" / "b.json"), "--target", url])
    err = capsys.readouterr().err
    assert code == 1 and "alice:xxxxx@" in err and "s3cret" not in err


@pytest.mark.parametrize("behaviour", ["drip", "drip-head", "silent", "endless", "redirect", "short", "badgzip"])
def test_every_misbehaviour_is_a_clear_error_within_the_deadline(behaviour):
    with MisbehavingServer() as server:
        started = time.monotonic()
        with pytest.raises(VLLMError) as err:
            VLLMClient(with_password(server.url(behaviour)), timeout=1.0, max_answer=1024 * 1024).tokenize_text("hi")
        assert time.monotonic() - started < 1.5
    assert "s3cret" not in str(err.value)
