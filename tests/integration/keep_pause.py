"""Streams across a keep-pause weight update, many in a row, the trainer announcing on the real versions topic.

Shared by the stand-in engine's test (``tests/integration/producers/test_applied_versions.py``) and real
vLLM's (``tests/integration/e2e/test_vllm_versions.py``). Each run: one streamed call through an
in-process interceptor that follows the topic; at its first chunk the trainer pauses the engine
(``keep``), updates it, announces ``v<k>`` with one standing ``VersionAnnouncer`` (which returns once
every live interceptor applied it) and resumes: ``sync(k, announce)`` does all that (``label_sync`` for a
label only; real vLLM's test passes ``push_weights``). ``updates_in_one_stream`` instead runs many label
updates inside one long stream, each once more tokens arrived after the last resume, the engine paced
(``compose.engines.vllm_rig.pace``) so it is still generating after each resume. A CPU burner
(``cpu_burner``) loads the machine beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from compose.engines.vllm_rig.admin import pause, resume, set_version
from compose.engines.vllm_rig.pace import paced
from producers.http.app import Interceptor
from producers.settings import InterceptorSettings
from schemas.kafka.announce import AnnounceFailed, NotConfirmed, VersionAnnouncer
from schemas.kafka.topics import TopicNames
from schemas.records import CallCaptured
from tests.unit.producers.conftest import RecordingPublisher


@contextlib.contextmanager
def cpu_burner(nice: int = 0) -> Iterator[subprocess.Popen]:
    """One process spinning a core for the duration (the load under which labels were seen to lag), at ``nice``."""
    proc = subprocess.Popen([*(["nice", "-n", str(nice)] if nice else []), sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


class Tap(httpx.AsyncBaseTransport):
    """Between interceptor and engine: counts each streamed call's chunks as the engine sends them (and calls
    ``on_first`` at the first), and with ``strip`` keeps its ``weight_versions`` (the engine's truth of which
    version sampled each token) but hides them from the interceptor, which must then label by itself."""

    def __init__(self, strip: bool) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.strip = strip
        self.truth: list[list[dict]] = []  # per streamed call, in order
        self.chunks = 0  # tokens the engine sent of the current call
        self.arrivals: list[float] = []  # when each of them reached the interceptor (monotonic)
        self.on_first: Callable[[], None] | None = None
        # Set: the next chunk with tokens ends the call as the engine ends one at max_tokens (finish "length",
        # then [DONE]; closing the response makes vLLM drop the request), so a stream lasts as long as needed.
        self.end_now = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/chat/completions"):
            return response
        spans: list[dict] = []
        self.truth.append(spans)
        self.chunks = 0
        self.arrivals = []

        async def strip() -> Any:
            buffer = b""
            async for piece in response.stream:  # type: ignore[union-attr]
                buffer += piece
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.startswith(b"data: {"):
                        # orjson: the tap shares the interceptor's process, and its GIL, with the trainer's
                        # announcements; the stdlib's json per chunk slowed both under load.
                        doc = orjson.loads(line[6:])
                        for choice in doc.get("choices") or []:
                            if self.strip and choice.get("weight_versions"):
                                spans.extend(choice.pop("weight_versions"))
                            if self.strip:
                                choice.pop("weight_versions", None)
                            got = len(choice.get("token_ids") or []) or bool((choice.get("delta") or {}).get("content"))
                            if got:
                                self.chunks += got
                                self.arrivals += [time.monotonic()] * got
                                if self.chunks == got and self.on_first is not None:
                                    self.on_first()
                                if self.end_now:
                                    choice["finish_reason"] = "length"
                        line = b"data: " + orjson.dumps(doc)
                        if self.end_now and b'"finish_reason":"length"' in line:
                            yield line + b"\n\ndata: [DONE]\n\n"
                            return
                    yield line + b"\n"
            if buffer:
                yield buffer

        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
        return httpx.Response(response.status_code, headers=headers, stream=_Stream(strip(), response),
                              extensions=response.extensions)


class _Stream(httpx.AsyncByteStream):
    def __init__(self, gen: Any, response: httpx.Response) -> None:
        self.gen, self.response = gen, response

    async def __aiter__(self) -> Any:
        async for piece in self.gen:
            yield piece

    async def aclose(self) -> None:
        await self.response.aclose()


@dataclass
class Run:
    k: int
    captured: CallCaptured | None = None
    truth: list[dict] = field(default_factory=list)  # the engine's spans, when it reported them
    seen_at_resume: int = -1  # tokens the engine had sent when the announcement returned
    announce_s: float = 0.0
    before_announce_s: float = 0.0  # from the first token to the announcement: the pause, the update
    after_resume: int = 0  # tokens that reached the interceptor after the resume returned: generated after it

    @property
    def spans(self) -> list[tuple[str, int, int]]:
        assert self.captured is not None
        return [(s.version, s.start, s.end) for s in self.captured.facts.version_spans]


Sync = Callable[[int, Callable[[str], None]], None]


ANNOUNCE_TRIES = 3


def announce_through_broker_stalls(announcer: VersionAnnouncer, label: str, k: int) -> None:
    """Announce ``label`` (step ``k``) as a trainer would: again, with the engine still paused, when the broker did
    not take it or its confirmations could not be read (beside the CPU burner the broker stalled 30 s once, in
    three of four fresh-clone runs: not the labels under test). ``NotConfirmed`` (an interceptor that did not
    apply it) is never retried: that is what the tests judge."""
    for attempt in range(1, ANNOUNCE_TRIES + 1):
        try:
            announcer.announce(label, k, confirm_timeout_s=20)
            return
        except NotConfirmed:
            raise
        except AnnounceFailed as exc:
            if attempt == ANNOUNCE_TRIES:
                raise
            print(f"announcement of {label} failed (try {attempt} of {ANNOUNCE_TRIES}), again: {exc}")


def label_sync(engine_url: str) -> Sync:
    """Pause (keep), name the weights ``v<k>``, announce, resume: an update of the label only."""
    def sync(k: int, announce: Callable[[str], None]) -> None:
        pause(engine_url, "keep")
        try:
            set_version(engine_url, f"v{k}")
            announce(f"v{k}")
        finally:
            resume(engine_url)
    return sync


@contextlib.asynccontextmanager
async def _interceptor(engine_url: str, bootstrap: str, names: TopicNames, strip: bool) -> Any:
    """An in-process interceptor following the versions topic, its engine behind a ``Tap``: (http, tap, publisher, model)."""
    transport = Tap(strip)
    upstream = httpx.AsyncClient(base_url=engine_url, timeout=120, transport=transport)
    publisher = RecordingPublisher()
    settings = InterceptorSettings(upstream_url=engine_url, bootstrap=bootstrap, topics=names, follow_versions=True)
    app = Interceptor(settings, publisher=publisher, upstream=upstream)  # type: ignore[arg-type]
    await app.startup()
    try:
        model = (await upstream.get("/v1/models")).json()["data"][0]["id"]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://tt",
                                     timeout=300) as http:
            yield http, transport, publisher, model
    finally:
        await app.shutdown()


@contextlib.asynccontextmanager
async def _announcer(bootstrap: str, names: TopicNames) -> Any:
    """The trainer's standing announcer (one set of clients for every update), opened off the event loop."""
    announcer = VersionAnnouncer(bootstrap, topic=names.policy_versions)
    await asyncio.to_thread(announcer.open)
    try:
        yield announcer
    finally:
        await asyncio.to_thread(announcer.close)


def _last_capture(publisher: RecordingPublisher) -> CallCaptured:
    return [e.body for e in publisher.events if isinstance(e.body, CallCaptured)][-1]


async def keep_pause_runs(engine_url: str, bootstrap: str, names: TopicNames, runs: int, *, max_tokens: int,
                          sync: Sync, strip: bool, first: int = 1, counts: Callable[[Run], bool] | None = None,
                          budget_s: float = float("inf")) -> list[Run]:
    """Streams, each across one keep-pause update announced as ``v<k>`` (k = first, first+1, ...), until ``runs``
    of them ``counts`` (default: every one), or ``budget_s`` seconds have passed (then fewer: the caller says)."""
    deadline = time.monotonic() + budget_s
    out: list[Run] = []
    async with _interceptor(engine_url, bootstrap, names, strip) as (http, transport, publisher, model), \
            _announcer(bootstrap, names) as announcer:
        k = first
        while sum(1 for r in out if counts is None or counts(r)) < runs and time.monotonic() < deadline:
            out.append(await _one(http, transport, announcer, k, model, max_tokens, sync))
            out[-1].captured = _last_capture(publisher)
            out[-1].truth = transport.truth[-1]
            k += 1
    return out


@dataclass
class Update:
    """One keep-pause update inside a stream: when each step returned (monotonic), and the tokens sent by then."""
    k: int
    asked: float = 0.0  # the pause was asked
    paused: float = 0.0  # the pause and the engine's label returned
    announced: float = 0.0  # the announcement returned: every live interceptor had applied v<k>
    resumed: float = 0.0  # the resume returned
    tokens_at_ask: int = 0


@dataclass
class OneStream:
    captured: CallCaptured
    arrivals: list[float]  # when each generated token reached the interceptor
    updates: list[Update]

    def labels(self) -> list[str]:
        return [s.version for s in self.captured.facts.version_spans for _ in range(s.start, s.end)]

    def generated_after(self, u: Update, until: float) -> int:
        """Tokens that reached the interceptor after ``u``'s resume and before ``until``: the engine, frozen from
        the pause to the resume (through an announcement that takes ~100 ms and more), generated them after it."""
        return sum(u.resumed < t < until for t in self.arrivals)


async def updates_in_one_stream(engine_url: str, bootstrap: str, names: TopicNames, updates: int, *,
                                max_tokens: int, after: int, first: int = 1, pace_ms: float | None = None) -> OneStream:
    """One streamed call across ``updates`` keep-pause updates of the label (``label_sync``), announced as ``v<k>``
    on the topic (k = first, ...); each after ``after`` more tokens reached the interceptor since the last resume.
    After the last, and ``after`` tokens more, the tap ends the call (``Tap.end_now``)."""
    async with _interceptor(engine_url, bootstrap, names, False) as (http, tap, publisher, model), \
            _announcer(bootstrap, names) as announcer:
        done, log = [False], []

        def tokens_past(mark: int) -> bool:  # `after` tokens beyond mark arrived, or the stream ended (polling)
            while tap.chunks < mark + after and not done[0]:
                time.sleep(0.005)
            return tap.chunks >= mark + after

        def drive() -> None:
            try:
                updates_then_end()
            finally:  # a failed update ends the stream now, and its error is raised below, not a long stream's
                tap.end_now = True

        def updates_then_end() -> None:
            mark = tap.chunks
            for k in range(first, first + updates):
                if not tokens_past(mark):
                    return
                u = Update(k, asked=time.monotonic(), tokens_at_ask=tap.chunks)
                log.append(u)
                pause(engine_url, "keep")
                try:
                    set_version(engine_url, f"v{k}")
                    u.paused = time.monotonic()
                    announce_through_broker_stalls(announcer, f"v{k}", k)
                    u.announced = time.monotonic()
                finally:
                    resume(engine_url)
                    u.resumed = time.monotonic()
                mark = tap.chunks
            tokens_past(mark)

        tasks: list[asyncio.Future] = []
        tap.on_first = lambda: tasks.append(asyncio.ensure_future(asyncio.to_thread(drive)))
        tap.end_now = False
        body = {"model": model, "messages": [{"role": "user", "content": "go on"}], "max_tokens": max_tokens,
                "stream": True, "ignore_eos": True, **(paced(pace_ms) if pace_ms else {})}
        try:
            r = await http.post(f"/ng-rollout/ks-{uuid.uuid4().hex[:6]}/training-token-capture/v1/chat/completions",
                                json=body)
        finally:
            tap.on_first = None
            done[0] = True
        assert r.status_code == 200, r.text
        assert tasks, "the stream carried no tokens"
        await tasks[0]
        return OneStream(_last_capture(publisher), list(tap.arrivals), log)


async def _one(http: httpx.AsyncClient, tap: Tap, announcer: VersionAnnouncer, k: int, model: str, max_tokens: int,
               sync: Sync) -> Run:
    run = Run(k)
    rid = f"kp{k}-{uuid.uuid4().hex[:6]}"

    first = [0.0]

    def announce(label: str) -> None:  # before the resume; returns once every live interceptor applied it
        started = time.monotonic()
        run.before_announce_s = started - first[0]
        announce_through_broker_stalls(announcer, label, k)
        run.announce_s = time.monotonic() - started
        run.seen_at_resume = tap.chunks

    tasks: list[asyncio.Future] = []
    resumed = [float("inf")]

    def sync_then_note() -> None:
        sync(k, announce)
        resumed[0] = time.monotonic()  # the resume returned (the last step of every sync)

    def on_first() -> None:
        first[0] = time.monotonic()
        tasks.append(asyncio.ensure_future(asyncio.to_thread(sync_then_note)))

    tap.on_first = on_first
    body = {"model": model, "messages": [{"role": "user", "content": f"go {k}"}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}
    try:
        r = await http.post(f"/ng-rollout/{rid}/training-token-capture/v1/chat/completions", json=body)
    finally:
        tap.on_first = None
    assert r.status_code == 200, r.text
    assert tasks, "the stream carried no tokens"
    await tasks[0]
    run.after_resume = sum(t > resumed[0] for t in tap.arrivals)
    return run
