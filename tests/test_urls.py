import pytest

from exporter.peers.urls import redact_url


@pytest.mark.parametrize("url, shown", [
    ("http://u:p@h:8/x", "http://u:xxxxx@h:8/x"),
    ("http://u@h/x", "http://u:xxxxx@h/x"),
    ("http://[::1]:9/x", "http://[::1]:9/x"),
    ("http://u:p@[::1]:9/x", "http://u:xxxxx@[::1]:9/x"),
    ("http://u:p@h:99999/x", "<unparsable URL>"),  # a port out of range raised ValueError from .port
    ("http://u:p@[::1/x", "<unparsable URL>"),
    ("http://h:9/metrics", "http://h:9/metrics"),
])
def test_a_url_is_shown_without_its_password_and_a_hostile_one_never_raises(url, shown):
    assert redact_url(url) == shown
