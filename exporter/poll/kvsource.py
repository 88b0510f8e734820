"""One engine's KV cache events, read on a thread of its own (ZeroMQ SUB).

vLLM binds its PUB socket when its endpoint has `*` (`tcp://*:5557`): we connect to the
pod's address. With any other tcp endpoint vLLM connects, and we bind (`bind:`). A
publisher is a peer like any other: each message is capped in size by ZeroMQ before it is
read (a larger one drops the connection), few are queued, the decoding has a budget a
second (a flood is shed and counted, never slows the polls), and the index the events
feed is capped. A sequence gap is asked once of the replay socket, with one deadline for
the whole answer; what it does not give back is counted as dropped. stop() never waits
on the publisher: the thread sees the flag within one poll of its socket.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Callable, Sequence

from ..logfields import fields
from ..peers import files
from ..parse.tokenjson import TokenText
from ..parse.kvevents import END_OF_REPLAY, MAX_PAYLOAD, KVEventError, decode
from ..series import kvtext
from ..series.blockindex import BlockIndex, KVView, Limits

log = logging.getLogger(__name__)

QUEUED = 32  # messages ZeroMQ holds for us: memory stays under QUEUED * MAX_PAYLOAD whatever the publisher sends
BUDGET = 2_000_000  # block hashes and token ids decoded a second; past it, batches are shed until the next second
REPLAY_DEADLINE = 2.0  # seconds for one replay's whole answer
REPLAY_MAX = 10_000  # batches taken from one replay
TICK = 0.2  # seconds the thread waits on its socket before it looks at the stop flag again
EARLIER = 10  # short windows before the recent one that say what is usual
MAX_GAP = 1_000_000
HISTORY = 2000  # batches asked of the replay socket at our start: the newest, what its deadline lets come
REDIAL_MIN, REDIAL_MAX = 1.0, 30.0  # seconds before dialing a publisher again after it dropped us, doubling  # a jump further than this is a new publisher, not lost batches


MAX_TOKENIZER_BYTES = 64 * 1024 * 1024  # a large vocabulary's tokenizer.json is 10-20 MB


def kept(source: KVEventSource | None, target, config, clock: Callable[[], float]) -> KVEventSource | None:
    """The source a target's poller keeps after a reload: the same one while what it reads
    holds, else the old one stopped (never waited on) and a new one started."""
    where = target.kv_events if target is not None else None
    wanted = (where, config.kv_events, min(s for _, s in config.global_.windows)) if where is not None else None
    if source is not None and source.settings == wanted:
        return source
    if source is not None:
        source.stop()
    if wanted is None:
        return None
    settings = config.kv_events
    new = KVEventSource(target.name, where.address, where.topic, where.replay, where.bind,
                        Limits(blocks=settings.index_blocks, horizon=(EARLIER + 1) * wanted[2] + 60.0), wanted[2],
                        tokenizer=settings.tokenizer, clock=clock)
    new.settings = wanted
    new.start()
    return new


@functools.lru_cache(maxsize=4)
def _token_text(path: str, mtime_ns: int, size: int) -> TokenText:
    """One decoder a tokenizer file (as it is now), however many pods' streams use it: a
    large vocabulary's is 10-20 MB of JSON and tens of MB decoded."""
    return TokenText(json.loads(files.read_bytes(path, MAX_TOKENIZER_BYTES)))


class KVEventSource:
    def __init__(self, target: str, endpoint: str, topic: str = "", replay: str | None = None, bind: bool = False,
                 limits: Limits = Limits(), window: float = 60.0, tokenizer: str = "",
                 clock: Callable[[], float] = time.time):
        self.target, self.endpoint, self.topic, self.replay, self.bind = target, endpoint, topic, replay, bind
        self.window, self.tokenizer, self.clock = window, tokenizer, clock
        self.decode_tokens: Callable[[Sequence[int]], str] | None = None  # once the tokenizer is read, off the poll
        self.settings: tuple | None = None
        self.index = BlockIndex(limits)
        self.lock = threading.Lock()
        self.stats = KVView(endpoint)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._second, self._spent = 0, 0
        self._redial_at: float | None = None  # when to dial the publisher again (monotonic), while disconnected
        self._backoff = REDIAL_MIN

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"kv-events {self.target}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0.0) -> None:
        self._stop.set()
        if self._thread is not None and timeout > 0:
            self._thread.join(timeout)

    def view(self, now: float) -> KVView:
        with self.lock:
            recent = self.index.window(now, self.window)
            earlier = self.index.window(now - self.window, EARLIER * self.window)
            size = tuple(sorted(self.index.size().items()))
            stats, evicted = self.stats, self.index.evicted
        text = kvtext.divergence(recent.divergence, self.decode_tokens) if recent.divergence is not None else None
        labels = tuple(sorted(kvtext.group_labels(recent.groups, self.decode_tokens).items()))
        return replace(stats, recent=recent, earlier=earlier, size=size, evicted=evicted, divergence_text=text, group_labels=labels)

    # --- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        if self.tokenizer:
            self._read_tokenizer()
        try:
            import zmq
        except ImportError:
            self._note(error="pyzmq is not installed: pip install pyzmq")
            return
        ctx = zmq.Context()
        try:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, QUEUED)
            sub.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD + 4096)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
            (sub.bind if self.bind else sub.connect)(self.endpoint)
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while not self._stop.is_set():
                ready = dict(poller.poll(TICK * 1000))
                if monitor in ready:
                    self._watch(monitor, zmq)
                if self._redial_at is not None and time.monotonic() >= self._redial_at and not self.stats.connected:
                    # ZeroMQ does not dial again after a peer broke its rules (a message over the cap)
                    sub.disconnect(self.endpoint)
                    sub.connect(self.endpoint)
                    self._redial_at, self._backoff = time.monotonic() + self._backoff, min(REDIAL_MAX, 2 * self._backoff)
                if sub in ready:
                    for _ in range(QUEUED):  # a few at a time, then the flag again
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(frames, ctx, zmq)
        except Exception as exc:  # noqa: BLE001 - the sidecar outlives its event reader
            log.exception("kv events: the reader stopped", extra=fields(target=self.target))
            self._note(error=f"reader stopped: {type(exc).__name__}: {exc}", connected=False)
        finally:
            ctx.destroy(linger=0)

    def _read_tokenizer(self) -> None:
        try:
            stat = os.stat(self.tokenizer)
            self.decode_tokens = _token_text(self.tokenizer, stat.st_mtime_ns, stat.st_size).decode
        except (OSError, ValueError) as exc:
            log.error("kv events: tokenizer %s unreadable, token ids shown instead of text: %s", self.tokenizer, exc,
                      extra=fields(target=self.target))

    def _watch(self, monitor, zmq) -> None:
        from zmq.utils.monitor import recv_monitor_message
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            connected = event["event"] in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED)
            if connected:
                self._redial_at, self._backoff = None, REDIAL_MIN
            elif not self.bind and self._redial_at is None:
                self._redial_at = time.monotonic() + self._backoff
            if connected != self.stats.connected:
                log.info("kv events: %s", "connected" if connected else "disconnected",
                         extra=fields(target=self.target, source=self.endpoint))
            self._note(connected=connected)

    def _handle(self, frames: list[bytes], ctx, zmq) -> None:
        now = self.clock()
        second = int(time.monotonic())
        if second != self._second:
            self._second, self._spent = second, 0
        if self._spent > BUDGET:
            self._note(shed=self.stats.shed + 1)
            return
        self._spent += sum(len(f) for f in frames) // 2  # about one item per two bytes of msgpack
        try:
            batch = decode(frames)
        except KVEventError as exc:
            self._note(errors=self.stats.errors + 1, error=str(exc))
            return
        last = self.index.last_seq
        with self.lock:
            if last is not None and (batch.seq <= last or batch.seq - last > MAX_GAP):
                self.index.reset(now, cleared=False)  # a new publisher: its cache starts empty
                self.stats = replace(self.stats, restarts=self.stats.restarts + 1)
                last = None
        if last is not None and batch.seq > last + 1:
            self._fill(last + 1, batch.seq, ctx, zmq)
        elif last is None and batch.seq > 0 and self.replay and not self.stats.received:
            # our first batch: what the publisher still holds says which prompt and tenant
            # each cached block belongs to (a salt rides only on a prompt's first block)
            self._fill(max(0, batch.seq - HISTORY), batch.seq, ctx, zmq, history=True)
        with self.lock:
            self.index.apply(batch, now)
            self.index.last_seq = batch.seq
            self.stats = replace(self.stats, received=self.stats.received + 1, last_message=now, connected=True)

    def _fill(self, first: int, upto: int, ctx, zmq, history: bool = False) -> None:
        """Batches first..upto-1 from the replay socket, once, within one deadline. The
        `history` before our start is placed at the publisher's time (at the latest now),
        so it fills the index without counting as what the cache does now; a gap counts."""
        got = 0
        if self.replay:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_PAYLOAD + 4096)
            try:
                sock.connect(self.replay)
                sock.send_multipart([b"", first.to_bytes(8, "big")])
                deadline = time.monotonic() + REPLAY_DEADLINE
                while got < min(REPLAY_MAX, upto - first) and not self._stop.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0 or not sock.poll(min(left, TICK) * 1000):
                        if left <= 0:
                            break
                        continue
                    frames = sock.recv_multipart()
                    if len(frames) != 4 or int.from_bytes(frames[2], "big") == END_OF_REPLAY:
                        break
                    try:
                        batch = decode(frames[1:])
                    except KVEventError as exc:
                        self._note(errors=self.stats.errors + 1, error=f"replay: {exc}")
                        continue
                    if first <= batch.seq < upto:
                        now = self.clock()
                        with self.lock:
                            self.index.apply(batch, min(batch.ts, now) if history else now)
                        got += 1
            finally:
                sock.close(linger=0)
        lost = 0 if history else upto - first - got  # what a publisher dropped before we came is no loss of ours
        self._note(dropped=self.stats.dropped + lost, replayed=self.stats.replayed + got)
        if history:
            log.info("kv events: %d of the %d batches before our start replayed (sequence %d..%d)", got, upto - first, first,
                     upto - 1, extra=fields(target=self.target))
        if lost:
            log.warning("kv events: %d batches lost (sequence %d..%d), %d replayed", lost, first, upto - 1, got,
                        extra=fields(target=self.target))

    def _note(self, error: str | None = None, **changes) -> None:
        with self.lock:
            if error is not None:
                changes["last_error"] = error
            self.stats = replace(self.stats, **changes)
