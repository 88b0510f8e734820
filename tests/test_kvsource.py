"""exporter/poll/kvsource.py: a target's KV event stream read on its own thread, from real
ZeroMQ sockets on 127.0.0.1, well-behaved and hostile publishers both."""
from __future__ import annotations

import resource
import threading
import time

import msgpack
import pytest
import zmq

from exporter.parse.kvevents import MAX_ITEMS
from exporter.poll.kvsource import KVEventSource
from exporter.series.blockindex import Limits

from conftest import free_port
from kvpub import frames, stored

HEADER = list(range(100, 116))


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return None


@pytest.fixture
def publisher():
    """A PUB socket bound as vLLM binds `tcp://*:PORT` (here on 127.0.0.1), and a source connected to it."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = free_port()
    pub.bind(f"tcp://127.0.0.1:{port}")
    sources = []

    def source(**kw) -> KVEventSource:
        s = KVEventSource("vllm-0", f"tcp://127.0.0.1:{port}", "kv", **kw)
        s.start()
        sources.append(s)
        assert wait_for(lambda: s.view(time.time()).connected), "never connected"
        time.sleep(0.2)  # a SUB sees only what is sent after its subscription reached the publisher
        return s

    yield pub, source
    for s in sources:
        s.stop(timeout=2)
    ctx.destroy(linger=0)


def test_a_publisher_vllm_binds_is_read_and_its_batches_counted(publisher):
    pub, source = publisher
    src = source()
    for seq in range(5):
        pub.send_multipart(frames(seq, [stored([seq + 1], None, HEADER)]))
    view = wait_for(lambda: (lambda v: v if v.received == 5 else None)(src.view(time.time())))
    assert view and view.dropped == 0 and view.errors == 0 and view.recent.counts.stores == 5
    assert view.live(time.time() - 60)


def test_a_publisher_that_connects_to_us_is_read_when_we_bind():
    port = free_port()
    src = KVEventSource("vllm-0", f"tcp://127.0.0.1:{port}", "kv", bind=True)
    src.start()
    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)
        pub.connect(f"tcp://127.0.0.1:{port}")
        assert wait_for(lambda: src.view(time.time()).connected)
        time.sleep(0.2)
        pub.send_multipart(frames(0, [stored([1], None, HEADER)]))
        assert wait_for(lambda: src.view(time.time()).received == 1)
    finally:
        src.stop(timeout=2)
        ctx.destroy(linger=0)


def test_a_gap_is_asked_once_of_the_replay_socket_and_what_it_lacks_is_dropped(publisher):
    pub, source = publisher
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    replay_port = free_port()
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    asked = []

    def serve():  # vLLM's replay: every buffered batch from the asked sequence on, then -1; it kept 3 and 4 only
        if router.poll(10_000):
            client, _, start = router.recv_multipart()
            asked.append(int.from_bytes(start, "big"))
            for seq in (3, 4):
                router.send_multipart([client, b"", *frames(seq, [stored([seq + 1], None, HEADER)])])
            router.send_multipart([client, b"", b"", b"\xff" * 8, b""])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        src = source(replay=f"tcp://127.0.0.1:{replay_port}")
        pub.send_multipart(frames(0, [stored([1], None, HEADER)]))
        pub.send_multipart(frames(5, [stored([6], None, HEADER)]))  # 1-4 never sent live
        view = wait_for(lambda: (lambda v: v if v.received == 2 else None)(src.view(time.time())))
        server.join(5)
        assert asked == [1] and view.replayed == 2 and view.dropped == 2
    finally:
        ctx.destroy(linger=0)


def test_at_our_start_the_publishers_history_says_whose_cached_blocks_are_whose_without_counting_as_now(publisher):
    """A salt rides only on a prompt's first block: a sidecar that starts after the tenants'
    prompts were cached asks the replay socket for what vLLM still holds."""
    pub, source = publisher
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    replay_port = free_port()
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    long_ago = time.time() - 3600

    def serve():
        if router.poll(10_000):
            client, _, start = router.recv_multipart()
            assert int.from_bytes(start, "big") == 0
            router.send_multipart([client, b"", *frames(0, [stored([1], None, HEADER, salt="tenant-a")], ts=long_ago)])
            router.send_multipart([client, b"", b"", b"\xff" * 8, b""])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        src = source(replay=f"tcp://127.0.0.1:{replay_port}")
        pub.send_multipart(frames(7, [stored([2], 1, list(range(300, 316)))]))  # a turn under tenant-a's cached prompt
        view = wait_for(lambda: (lambda v: v if v.received == 1 else None)(src.view(time.time())))
        server.join(5)
        assert view.replayed == 1 and view.dropped == 0
        assert view.recent.counts.stores == 1 and view.recent.counts.by_salt == {"tenant-a": 16}
    finally:
        ctx.destroy(linger=0)


def test_a_publisher_that_starts_its_sequence_again_is_a_new_cache(publisher):
    pub, source = publisher
    src = source()
    pub.send_multipart(frames(0, [stored([1], None, HEADER)]))
    pub.send_multipart(frames(1, [stored([2], 1, HEADER)]))
    pub.send_multipart(frames(0, [stored([3], None, HEADER)]))  # vLLM restarted
    view = wait_for(lambda: (lambda v: v if v.received == 3 else None)(src.view(time.time())))
    assert view.restarts == 1 and dict(view.size)["blocks"] == 1 and view.dropped == 0


def test_a_hostile_publisher_is_counted_and_dropped_never_crashes_or_grows_the_reader(publisher):
    pub, source = publisher
    src = source(limits=Limits(blocks=10_000))
    # ten million hashes: 90 MB, over ZeroMQ's message cap (built before the peak is taken: the publisher is this process)
    huge = msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": list(range(2**40, 2**40 + 10_000_000)), "medium": None}]])
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pub.send_multipart([b"kv", b"\x00" * 8, b"\xc1 not msgpack"])
    pub.send_multipart([b"kv", b"short", b"x"])
    pub.send_multipart([b"kv", b"\x00" * 8])
    # a million and one hashes: under the size cap, over the item cap
    pub.send_multipart([b"kv", (1).to_bytes(8, "big"), msgpack.packb(
        [1.0, [{"type": "BlockRemoved", "block_hashes": [1] * (MAX_ITEMS + 1), "medium": None}]])])
    # ...which drops the connection: the reader dials again
    pub.send_multipart([b"kv", (2).to_bytes(8, "big"), huge])
    assert wait_for(lambda: src.view(time.time()).errors >= 4, 20), src.view(time.time())

    def probe():  # what is sent while the reader reconnects is lost: send until one batch is read
        pub.send_multipart(frames(3, [stored([2], None, HEADER)]))
        return src.view(time.time()).received >= 1
    assert wait_for(probe, 30), src.view(time.time())
    # a flood of batches far over the index's cap, with jumps in the sequence
    seq = 10
    for i in range(20_000):
        seq += 1 if i % 1000 else 2**50
        pub.send_multipart(frames(seq, [stored([10**6 + i], None, [i % 500] * 16)]))
    assert wait_for(lambda: src.view(time.time()).received > 1000, 30), src.view(time.time())
    time.sleep(1)
    view = src.view(time.time())
    assert src._thread.is_alive()
    assert dict(view.size)["blocks"] <= 10_000 and dict(view.size)["groups"] <= 64
    assert view.restarts >= 1  # a jump of 2**50 is a new publisher, not a quadrillion lost batches
    assert view.dropped < 1_000_000
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 200, grown_mib  # the publisher's own copy of the 90 MB batch included
    # and it still reads a well-formed batch after all that
    pub.send_multipart(frames(seq + 1, [stored([7], None, HEADER)]))
    assert wait_for(lambda: src.view(time.time()).last_message is not None)


def test_stop_never_waits_on_a_publisher_and_a_silent_one_is_not_live():
    port = free_port()  # nobody publishes here
    src = KVEventSource("vllm-0", f"tcp://127.0.0.1:{port}", "kv")
    src.start()
    view = src.view(time.time())
    assert not view.connected and not view.live(time.time() - 60) and view.received == 0
    began = time.monotonic()
    src.stop()
    assert time.monotonic() - began < 0.5
    src._thread.join(2)
    assert not src._thread.is_alive()


def test_a_reload_keeps_the_stream_while_its_settings_hold_and_replaces_it_when_they_change():
    from dataclasses import replace

    from exporter.config.kvevents import KVEndpoint
    from exporter.config.sections import Target, load
    from exporter.poll.kvsource import kept

    cfg = load({})
    target = Target("vllm-0", "http://127.0.0.1:1/metrics", kv_events=KVEndpoint(f"tcp://127.0.0.1:{free_port()}", topic="kv"))
    first = kept(None, target, cfg, time.time)
    try:
        assert kept(first, target, cfg, time.time) is first  # an unrelated reload: the same reader, its index kept
        moved = replace(target, kv_events=KVEndpoint(f"tcp://127.0.0.1:{free_port()}", topic="kv"))
        second = kept(first, moved, cfg, time.time)
        assert second is not first and first._stop.is_set() and second.endpoint == moved.kv_events.address
        assert kept(second, replace(moved, kv_events=None), cfg, time.time) is None and second._stop.is_set()
    finally:
        for source in (first, second):
            source.stop(timeout=2)


def test_every_pods_stream_shares_one_decoder_of_a_tokenizer_file(tiny_tokenizer):
    """A discovered fleet reads one tokenizer.json per pod: parsed once, not once a pod."""
    sources = [KVEventSource(f"vllm-{i}", f"tcp://127.0.0.1:{free_port()}", "kv", tokenizer=str(tiny_tokenizer)) for i in range(3)]
    for s in sources:
        s._read_tokenizer()
    assert len({s.decode_tokens.__self__ for s in sources}) == 1
    assert sources[0].decode_tokens([0]) == "<s>"
