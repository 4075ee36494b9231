"""Property-based HTTP fuzzing of the interceptor (issue 15 item 2, the HTTP tier).

Hypothesis drives every dialect's generating route, the rollout-id path segment and the control
routes of one ``Interceptor`` per test (built once, lazily, on its own event loop, over a
scripted engine that always answers a valid completion, streamed or not):

* never a 5xx (the engine here never sends one, so none could be a faithful relay);
* every 4xx is in the caller's dialect's error shape and names the field or the problem;
* a 2xx capture published exactly its CallStarted intent and one CallCaptured/CallIncomplete;
  a refused request published nothing and sent nothing to the engine;
* the finish route answers 2xx only for a payload RolloutFinished can carry, 400 naming the
  field otherwise, 401 for a wrong or missing token; a rollout it finished takes the same
  payload again (200, nothing published) and refuses another (409 naming the fields);
* the interceptor's memory stays flat over bursts of fuzzed requests (tracemalloc).

Each test counts its inputs' outcomes (``tests.fuzzing.count``), printed in the terminal summary.
``TOKENTRAIL_FUZZ_EXAMPLES`` sets the examples per test (200 in ``make test``, 10,000 in ``make fuzz``).
"""

from __future__ import annotations

import asyncio
import copy
import gc
import itertools
import json
import random
import re
import tracemalloc
from typing import Any
from urllib.parse import unquote

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.finish import finish_request_body
from producers.http.app import Interceptor
from producers.http.route_policy import ENGINE_ADMIN, READ_ONLY
from producers.http.routing import PATH_RULE
from producers.settings import InterceptorSettings
from schemas.avro_fields import INT_MAX
from schemas.ids import ROLLOUT_ID_PATTERN, ROLLOUT_ID_RULE
from schemas.records import CallCaptured, CallIncomplete, RolloutFinished
from tests.fuzzing import COUNTS, count, fuzz_examples, fuzz_settings
from tests.unit.producers import raw_asgi
from tests.unit.producers.conftest import RecordingPublisher, vllm_chat_response
from tests.unit.producers.test_malformed_requests import (
    CAPTURE,
    ITEMS,
    ROUTES,
    TOP_FIELDS,
    VALID,
    encode,
    error_message,
    nested,
)

TOKEN = "s3cret"
MAX_BODY = 256 * 1024  # small, so that an oversized body (a 413) is cheap to send
SSE = ('data: {"choices":[{"index":0,"delta":{"content":"Hi"},"token_ids":[5],"finish_reason":"stop",'
       '"logprobs":{"content":[{"token":"Hi","logprob":-0.1}]}}],"prompt_token_ids":[1]}\n\ndata: [DONE]\n\n')
# A message names the field or the problem: a quoted name, or one of these words.
_FIELD_NAMES = sorted({f for fields in TOP_FIELDS.values() for f in fields} | set(ITEMS.values())
                     | {"role", "content", "type", "tool_calls", "tool_call_id", "name", "max_output_tokens"})
NAMES_SOMETHING = re.compile(r"'[^']+'|\"[^\"]+\"|\w\[\d+\]|\b(body|JSON|field|path|rollout|route|token|"
                             r"content[- ]type|empty|bytes|limit|nest|" + "|".join(_FIELD_NAMES) + r")\b",
                             re.IGNORECASE)




def dot_segment(raw_path: str) -> bool:
    """The oracle of the path rule: a '.' or '..' segment as sent, decoded once or twice, '/' or '\\' splitting."""
    text = raw_path.partition("?")[0]
    for _ in range(3):
        if {".", ".."} & set(re.split(r"[/\\]", text)):
            return True
        text = unquote(text)
    return False


def refused_by_the_path_rule(r: raw_asgi.RawResponse, r_: Rig, raw_path: bytes) -> bool:
    """True (after checking the 400) when ``raw_path`` breaks the path rule: checked before anything else."""
    if not dot_segment(raw_path.decode("ascii")):
        return False
    assert r.status == 400, (raw_path[:300], r.status, r.body[:500])
    assert PATH_RULE in r.json()["error"]["message"], r.body[:500]
    assert r_.publisher.all == [] and r_.engine.paths == [], (raw_path[:300], r_.engine.paths)
    return True


# -- the rig: one interceptor per test, on its own loop ------------------------------------------------

class Engine:
    """A vLLM-shaped engine that answers every generating call validly (streamed when asked)."""

    def __init__(self) -> None:
        self.requests = 0
        self.paths: list[str] = []  # every path the engine was sent, decoded as the engine decodes it

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.method == "GET" and request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "policy", "object": "model", "max_model_len": 32768}]})
        self.requests += 1
        try:
            stream = bool(json.loads(request.content or b"null").get("stream"))
        except (ValueError, AttributeError):
            stream = False
        if stream:
            return httpx.Response(200, content=SSE.encode(), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=vllm_chat_response([1, 2], [5, 6]))


class Rig:
    """An Interceptor over ``Engine`` with a RecordingPublisher, driven request by request from sync code."""

    def __init__(self, **overrides: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.publisher = RecordingPublisher()
        self.engine = Engine()
        settings = InterceptorSettings(**{"upstream_url": "http://engine", "bootstrap": "unused:9092",
                                          "control_token": TOKEN, "max_body_bytes": MAX_BODY, **overrides})
        self.client = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(self.engine.handler))
        self.app = Interceptor(settings, publisher=self.publisher, upstream=self.client)  # type: ignore[arg-type]
        self.loop.run_until_complete(self.app.startup())

    def reset(self) -> None:
        for log in (self.publisher.all, self.publisher.events, self.publisher.intents, self.publisher.raw):
            log.clear()
        self.engine.requests = 0
        self.engine.paths.clear()

    def call(self, method: str, raw_path: bytes, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
             content_type: bytes | None = b"application/json") -> raw_asgi.RawResponse:
        self.reset()
        hs = list(headers or [])
        coro = raw_asgi.call(self.app, method, raw_path, body=body, headers=hs)
        if content_type != b"application/json":  # raw_asgi always sends application/json: replace it
            coro.close()
            coro = _call_with_content_type(self.app, method, raw_path, body, hs, content_type)
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    def close(self) -> None:
        self.loop.run_until_complete(self.app.shutdown())
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


async def _call_with_content_type(app, method, raw_path, body, headers, content_type):
    """raw_asgi.call with another (or no) content-type header."""
    original = app

    async def wrapped(scope, receive, send):
        scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        if content_type is not None:
            scope["headers"].append((b"content-type", content_type))
        await original(scope, receive, send)

    return await raw_asgi.call(wrapped, method, raw_path, body=body, headers=headers)


_RIGS: dict[str, Rig] = {}


def rig(name: str, **overrides: Any) -> Rig:
    if name not in _RIGS:
        _RIGS[name] = Rig(**overrides)
    return _RIGS[name]


@pytest.fixture(scope="module", autouse=True)
def _close_rigs():
    yield
    while _RIGS:
        _RIGS.popitem()[1].close()


# -- strategies -------------------------------------------------------------------------------------------

ODD_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)  # incl. lone surrogates
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False), ODD_TEXT,
                    st.sampled_from(["", "user", "assistant", "system", "tool", "developer", "text", "image",
                                     "function", "m", "policy"]))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                    max_leaves=12)
PART_TYPES = ["text", "image", "image_url", "tool_use", "tool_result", "thinking", "redacted_thinking", "document",
              "input_text", "input_image", "output_text", "refusal", "function_call", "file", None, 3]
PART = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(PART_TYPES)},
                          optional={"text": JSON, "source": JSON, "image_url": JSON, "id": JSON, "name": JSON,
                                    "input": JSON, "content": JSON, "tool_use_id": JSON, "thinking": JSON,
                                    "signature": JSON, "cache_control": JSON}),
    JSON)
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["function", "custom", "web_search", None, 1])},
                          optional={"function": st.one_of(JSON, st.fixed_dictionaries(
                              {"name": JSON}, optional={"parameters": JSON, "description": JSON})),
                              "name": JSON, "parameters": JSON, "input_schema": JSON, "description": JSON}),
    st.fixed_dictionaries({"name": st.text(max_size=20)}, optional={"input_schema": JSON, "description": JSON}),
    JSON)


def big_string() -> st.SearchStrategy[str]:
    return st.builds(lambda n, c: c * n, st.integers(min_value=1_000, max_value=MAX_BODY + 4_096),
                     st.sampled_from(["x", "é", "\u202e", "\U0001F600", "\\", '"', "\x00"]))


FIELD_VALUE = st.one_of(JSON, big_string(), st.builds(nested, st.sampled_from([150, 199, 201, 254, 255, 600, 1023])))


@st.composite
def mutated_body(draw, dialect: str) -> tuple[bytes, str | None, bool]:
    """(encoded body, the fields the mutations touched joined by '|' or None, stream asked for) from VALID[dialect]."""
    body = copy.deepcopy(VALID[dialect])
    items = ITEMS[dialect]
    touched: list[str] = []
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        kind = draw(st.sampled_from(["top", "drop", "item", "item drop", "parts", "tools", "extra", "items"]))
        top = draw(st.sampled_from(TOP_FIELDS[dialect]))
        if kind == "top":
            body[top] = draw(FIELD_VALUE)
        elif kind == "drop":
            body.pop(top, None)
        elif kind == "extra":
            top = draw(st.text(min_size=1, max_size=12))
            body[top] = draw(FIELD_VALUE)
        elif kind == "tools":
            top = "tools"
            body["tools"] = draw(st.lists(TOOL, max_size=3))
        elif kind == "items":
            top = items
            body[items] = draw(st.lists(st.one_of(st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])},
                optional={"content": st.one_of(JSON, st.lists(PART, max_size=3)), "type": JSON,
                          "tool_calls": JSON, "call_id": JSON, "output": JSON}), JSON), max_size=4))
        elif isinstance(body.get(items), list) and body[items] and isinstance(body[items][0], dict):
            top = items
            first = body[items][0]
            name = draw(st.sampled_from(["role", "content", "type", "tool_calls", "name", "tool_call_id", "id"]))
            if kind == "item":
                first[name] = draw(FIELD_VALUE)
            elif kind == "item drop":
                first.pop(name, None)
            else:
                first["content"] = draw(st.lists(PART, min_size=1, max_size=4))
        else:
            continue
        touched.append(top)
    stream = draw(st.booleans())
    if stream:
        body["stream"] = True
    elif draw(st.booleans()):
        body["stream"] = False
    if draw(st.booleans()):
        raw = encode(body)
    else:  # ensure_ascii=False writes lone surrogates as they are: not UTF-8
        raw = re.sub(r'"__nested_(\d+)__"', lambda m: "[" * int(m[1]) + '"x"' + "]" * int(m[1]),
                     json.dumps(body, ensure_ascii=False)).encode("utf-8", "surrogatepass")
    return raw, "|".join(dict.fromkeys(touched)) or None, body.get("stream") is True


GARBAGE = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"", b" ", b"null", b"[]", b"{}", b"{", b'{"model": "m"', b"\xef\xbb\xbf{}", b"NaN",
                     b'{"messages": NaN}', b'{"a": 1e999}', b'{"a": "\\ud800"}', b"\xff\xfe{\x00}\x00",
                     b'{"model": "m", "model": 1}', b"[" * 2000]),
    st.builds(lambda n: b'{"model": "' + b"x" * n + b'"}',
              st.integers(min_value=MAX_BODY - 64, max_value=MAX_BODY + 64)),
    st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
)
CONTENT_TYPES = st.sampled_from([b"application/json", None, b"text/plain", b"application/x-www-form-urlencoded",
                                 b"multipart/form-data; boundary=x", b"application/json; charset=latin-1", b"\xff"])


# -- checks ----------------------------------------------------------------------------------------------

def refusal(test: str, dialect: str, r: raw_asgi.RawResponse, rig_: Rig) -> str:
    """The message of a 4xx, checked: the dialect's error shape, naming something; nothing recorded or sent."""
    message = error_message(dialect, r.json())
    assert isinstance(message, str) and NAMES_SOMETHING.search(message), (r.status, r.body[:2000])
    assert rig_.publisher.all == [] and rig_.engine.requests == 0, (r.status, r.body[:500], rig_.publisher.all)
    return message


def served(r: raw_asgi.RawResponse, rig_: Rig) -> str:
    """A 2xx capture: one intent, one record."""
    assert len(rig_.publisher.intents) == 1, rig_.publisher.all
    (event,) = rig_.publisher.events
    assert isinstance(event.body, (CallCaptured, CallIncomplete)), event
    return type(event.body).__name__


# -- 1. each dialect's generating route -------------------------------------------------------------------

@pytest.mark.fuzz
@pytest.mark.parametrize("dialect", ROUTES)
@fuzz_settings()
@given(data=st.data())
def test_fuzzed_bodies_are_served_or_refused_naming_the_field(dialect, data):
    test = f"body {dialect}"
    r_ = rig("capture")
    raw, field, stream = data.draw(mutated_body(dialect))
    r = r_.call("POST", (CAPTURE + ROUTES[dialect]).encode(), raw)
    assert r.status < 500, (r.status, raw[:500], r.body[:2000])
    if 200 <= r.status < 300:
        count(test, f"2xx {'stream' if stream else 'json'} {served(r, r_)}")
    else:
        assert 400 <= r.status < 500, (r.status, r.body[:500])
        message = refusal(test, dialect, r, r_)
        if r.status == 413:
            count(test, "refused 413")
        elif field is not None:  # the refusal names a field the mutations touched
            # (or says the body nests past orjson's 1,024 levels, which is found before any field is read;
            # an Anthropic tool without a name is "a custom tool needs a 'name'": weak, it names no index)
            fields = field.split("|")
            named = [f for f in fields if f in message]
            # Bytes that are not UTF-8 (a lone surrogate) cannot be read as far as a field: "not valid JSON".
            assert named or "levels deep" in message or "not valid JSON" in message or \
                ("tools" in fields and "tool" in message), \
                (fields, raw[:500], message)
            count(test, f"{r.status} names {'the' if len(fields) == 1 else 'a mutated'} field" if named
                  else f"{r.status} names the problem")
        else:
            count(test, f"{r.status} no field mutated")


@pytest.mark.fuzz
@pytest.mark.parametrize("dialect", ROUTES)
@fuzz_settings()
@given(raw=GARBAGE, content_type=CONTENT_TYPES)
def test_garbage_bytes_and_odd_content_types_are_a_4xx_saying_why(dialect, raw, content_type):
    test = f"garbage {dialect}"
    r_ = rig("capture")
    r = r_.call("POST", (CAPTURE + ROUTES[dialect]).encode(), raw, content_type=content_type)
    assert r.status < 500, (r.status, raw[:300], content_type, r.body[:2000])
    if 200 <= r.status < 300:  # garbage that happens to be a valid request
        count(test, f"2xx {served(r, r_)}")
        return
    message = refusal(test, dialect, r, r_)
    word = next((w for w in ("empty", "not valid JSON", "JSON object", "levels", "body") if w in message), "other")
    count(test, f"{r.status} {word}")


# -- 2. the rollout id segment and paths -----------------------------------------------------------------

ID_CHARS = st.sampled_from(list("aZ09._-~!$&'()*+,;=:@") + ["%2F", "%2f", "%09", "%0A", "%0D", "%00", "%20", "%25",
                                                            "%41", "%C3%A9", "%E2%80%AE", "%", "%G1", "..", "."])
ROLLOUT_IDS = st.one_of(
    st.sampled_from(["r-1", "step12.task7-r3", "A", "0", "a" * 200, "x.y_z-9"]),
    st.from_regex(ROLLOUT_ID_PATTERN, fullmatch=True).filter(lambda s: s.isascii()),
    st.lists(ID_CHARS, max_size=12).map("".join),
    st.builds(lambda n: "r" * n, st.integers(min_value=195, max_value=5_000)),
)
TAILS = st.one_of(
    st.just("/training-token-capture/v1/chat/completions"),
    st.sampled_from(["/training-token-capture/v1/chat/completions", "/training-token-capture/v1/messages",
                     "/training-token-capture/v1/responses", "/training-token-capture//v1/chat/completions",
                     "/training-token-capture/v1/models", "/v1/chat/completions", "/v1/models", "", "/",
                     "/training-token-capture", "/training-token-capture/", "/training-token-capture/sleep",
                     "/training-token-capture/v1/chat/completions/", "/%2e%2e/v1/chat/completions",
                     "/training-token-capture/v1/chat%2Fcompletions", "/training-token-capture/v1/mo%09dels"]),
    st.lists(ID_CHARS, max_size=8).map(lambda cs: "/" + "".join(cs)),
)
PREFIXES = st.sampled_from(["/ng-rollout/"] * 5 + ["//ng-rollout/", "/ng-rollout//", "/NG-ROLLOUT/", "/ng-rollout%2F",
                            "/ng-rollout/./", "/rollouts/"])
CHAT_CAPTURE = "/training-token-capture/v1/chat/completions"


@pytest.mark.fuzz
@fuzz_settings()
@given(prefix=PREFIXES, rollout_id=ROLLOUT_IDS, tail=TAILS, method=st.sampled_from(["POST", "GET", "DELETE"]))
def test_fuzzed_rollout_ids_and_paths_are_never_a_5xx(prefix, rollout_id, tail, method):
    test = "paths"
    r_ = rig("capture")
    raw_path = (prefix + rollout_id + tail).encode("ascii")
    r = r_.call(method, raw_path, json.dumps(VALID["chat"]).encode())
    assert r.status < 500, (method, raw_path[:300], r.status, r.body[:2000])
    if refused_by_the_path_rule(r, r_, raw_path):
        count(test, "400 path rule (dot segment)")
        return
    id_ok = ROLLOUT_ID_PATTERN.fullmatch(unquote(rollout_id)) is not None and "/" not in unquote(rollout_id)
    if prefix == "/ng-rollout/" and not id_ok:
        assert r.status == 400, (raw_path[:300], r.status, r.body[:1000])
        message = r.json()["error"]["message"]
        assert ROLLOUT_ID_RULE in message and "rejected, not rewritten" in message, message
        count(test, "400 names the rollout id rule")
        return
    if prefix == "/ng-rollout/" and tail == CHAT_CAPTURE and method == "POST" and id_ok and unquote(rollout_id) == \
            rollout_id:
        assert r.status == 200, (raw_path[:300], r.status, r.body[:1000])
    if 200 <= r.status < 300:
        if tail.startswith("/training-token-capture/v1/") and method == "POST" and r_.publisher.events:
            count(test, f"2xx {served(r, r_)}")
        else:
            assert r_.publisher.events == [], (raw_path, r_.publisher.events)
            count(test, "2xx forwarded, nothing recorded")
        return
    assert 400 <= r.status < 500, (r.status, r.body[:500])
    payload = r.json()
    message = payload["error"]["message"]
    assert NAMES_SOMETHING.search(message), (raw_path[:300], r.status, message)
    assert r_.publisher.all == [], (raw_path, r_.publisher.all)
    kind = "rollout id rule" if ROLLOUT_ID_RULE in message else ("path" if "path" in message else
                                                                 payload["error"].get("type", "?"))
    count(test, f"{r.status} {kind}")


# -- 2b. path spellings on every route table entry (issue 26 item 1) ---------------------------------------

# Every route the table names: the dialects' generating routes, the read-only routes (and a model id under
# /v1/models/), the engine admin routes the table refuses.
ROUTE_ENTRIES = sorted({*ROUTES.values(), *(r.path for r in READ_ONLY), "/v1/models/Qwen/Qwen3-0.6B",
                        *ENGINE_ADMIN})
ROUTE_PREFIXES = ["", "/ng-rollout/r-1", "/ng-rollout/r-1/training-token-capture"]
# What may stand between two segments, or replace one: dot segments in every spelling the probe used, and
# their harmless look-alikes (which must pass the path rule).
SPELLINGS = st.sampled_from(["..", ".", "%2e%2e", "%2E%2e", ".%2e", "%2e", "%252e%252e", "%252E", "..%2f", "..%2F",
                             "..%5c", "..%5C", "%2e%2e%2f", "%2e%2e%5c", "..\\", "%2e%2e%252f", "...", ".x", "a..b",
                             "x.", "%2f", "%2F%2F", "", "%5c", "%25", "v1", "models"])


@pytest.mark.fuzz
@fuzz_settings()
@given(prefix=st.sampled_from(ROUTE_PREFIXES), route=st.sampled_from(ROUTE_ENTRIES),
       inserts=st.lists(st.tuples(st.integers(min_value=0, max_value=8), SPELLINGS), min_size=1, max_size=3),
       target=st.sampled_from(["", *ENGINE_ADMIN[:6], "/tokentrail/admin/weight-version", "/v1/chat/completions"]),
       method=st.sampled_from(["GET", "POST", "HEAD"]), doubled=st.booleans())
def test_path_spellings_never_reach_another_route(prefix, route, inserts, target, method, doubled):
    test = "path spellings"
    r_ = rig("capture")
    segments = route.strip("/").split("/")
    for position, spelling in inserts:
        segments.insert(min(position, len(segments)), spelling)
    path = prefix + "/" + "/".join(segments) + target
    if doubled:
        path = path.replace("/", "//", 1) if "/" in path[1:] else path
    raw_path = path.encode("ascii")
    r = r_.call(method, raw_path, json.dumps(VALID["chat"]).encode())
    assert r.status < 500, (method, raw_path, r.status, r.body[:1000])
    if refused_by_the_path_rule(r, r_, raw_path):
        count(test, "400 path rule (dot segment)")
        return
    # Whatever else happened, no engine admin route was reached, and a forwarded request reached the engine at
    # exactly the (decoded) path the route table decided on.
    for seen in r_.engine.paths:
        assert seen.rstrip("/") not in ENGINE_ADMIN, (raw_path, seen)
    decoded = unquote(path)
    api_path = decoded
    for p in sorted(ROUTE_PREFIXES, key=len, reverse=True):
        if p and decoded.startswith(p + "/"):
            api_path = decoded[len(p):]
            break
    if 200 <= r.status < 300 and r_.engine.paths:
        assert api_path in r_.engine.paths or r_.publisher.events, (raw_path, api_path, r_.engine.paths)
    if r.status >= 400:
        assert NAMES_SOMETHING.search(r.json()["error"]["message"]), r.body[:500]
        assert r_.publisher.all == [] and r_.engine.requests == 0
    count(test, f"{r.status}")


# -- 3. the control routes -------------------------------------------------------------------------------

FINISH_VALUES = {
    "result": st.one_of(JSON, st.builds(nested, st.sampled_from([150, 198, 199, 200, 201, 254, 600]))),
    "attempt": st.one_of(st.integers(min_value=-3, max_value=5), st.sampled_from([INT_MAX, INT_MAX + 1, -(2**31),
                                                                                  2**63, 2**64, 1.0, 0.5, True]),
                         JSON),
    "final_response_id": st.one_of(st.none(), ODD_TEXT, st.just("chatcmpl-tt" + "0" * 32), JSON),
    "final_text": st.one_of(st.none(), ODD_TEXT, JSON),
}
FINISH_BODY = st.one_of(
    st.builds(lambda known, extra: {**known, **extra}, st.fixed_dictionaries({}, optional=FINISH_VALUES),
              st.dictionaries(st.text(max_size=8), JSON, max_size=2)),
    st.fixed_dictionaries({}, optional=FINISH_VALUES),
    JSON,
)
AUTHS = st.sampled_from([f"Bearer {TOKEN}"] * 6 + [None, "", "Bearer", f"bearer {TOKEN}", TOKEN, f"Bearer {TOKEN} ",
                                                   "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])


def finish_problem(raw: bytes) -> str | None:
    """The field RolloutFinished cannot carry (or "body"), or None for a payload it can: an oracle of the rules."""
    if not raw.strip():
        return None
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "body"
    if not isinstance(payload, dict):
        return "body"
    if set(payload) - {"result", "final_response_id", "final_text", "attempt"}:
        return "unknown"
    attempt = payload.get("attempt")
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)
                                or not 0 <= attempt <= INT_MAX):
        return "attempt"
    for name in ("final_response_id", "final_text"):
        value = payload.get(name)
        if value is not None and not isinstance(value, str):
            return name
    try:
        json.dumps(payload.get("result"), allow_nan=False)
    except (ValueError, RecursionError):
        return "result"
    depth, stack = 0, [(payload.get("result"), 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (dict, list)):
            depth = max(depth, level)
            stack.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return "result" if depth > 200 else None


_FRESH = itertools.count()


def _encode_finish(body: Any) -> bytes:
    return re.sub(r'"__nested_(\d+)__"', lambda m: "[" * int(m[1]) + '"x"' + "]" * int(m[1]),
                  json.dumps(body, ensure_ascii=False)).encode("utf-8", "surrogatepass")


@pytest.mark.fuzz
@fuzz_settings()
@given(body=st.one_of(FINISH_BODY.map(_encode_finish), GARBAGE), auth=AUTHS,
       rollout_id=st.one_of(st.just("r-1"), st.just("fresh"), ROLLOUT_IDS))
def test_the_finish_route_takes_only_what_rollout_finished_carries(body, auth, rollout_id):
    test = "finish"
    r_ = rig("control")
    if rollout_id == "fresh":  # a rollout never finished before (r-1 is finished again and again)
        rollout_id = f"r-fresh-{next(_FRESH)}"
    headers = [] if auth is None else [(b"authorization", auth.encode())]
    raw_path = f"/rollouts/{rollout_id}/finish".encode("ascii")
    r = r_.call("POST", raw_path, body, headers=headers)
    assert r.status < 500, (raw_path[:200], auth, body[:500], r.status, r.body[:2000])
    message = r.json().get("error", {}).get("message", "") if r.status >= 400 else ""
    if refused_by_the_path_rule(r, r_, raw_path):  # the path rule comes before everything
        count(test, "400 path rule (dot segment)")
        return
    if len(body) > MAX_BODY:  # admission, before any handler: the body limit comes before the token check
        assert r.status == 413 and "bytes" in message and r_.publisher.all == [], (r.status, r.body[:300])
        count(test, "refused 413")
        return
    if auth != f"Bearer {TOKEN}":
        assert r.status == 401 and "Authorization: Bearer" in message, (auth, r.status, r.body)
        assert r_.publisher.all == []
        count(test, "401 bad token")
        return
    # The id as sent, percent-decoded (routing.raw_segments): "%41" is "A" (RFC 3986: the same URL).
    decoded = unquote(rollout_id)
    id_ok = ROLLOUT_ID_PATTERN.fullmatch(decoded) is not None
    if not id_ok:
        assert r.status in (400, 404), (raw_path[:200], r.status, r.body[:500])
        assert r_.publisher.all == []
        if r.status == 400:
            assert ROLLOUT_ID_RULE in message or "rollout id" in message, message
        count(test, f"{r.status} rollout id")
        return
    problem = finish_problem(body)
    if problem is None:
        # One record per rollout attempt (issue 25): the rig remembers the finishes it acknowledged.
        finished: dict[str, tuple[RolloutFinished, str]] = r_.__dict__.setdefault("finished", {})
        payload = finish_request_body(body)
        prior = finished.get(decoded)
        if prior is not None and prior[0] == payload:
            assert r.status == 200 and r.json()["duplicate"] is True, (body[:500], r.status, r.body[:1000])
            assert r.json()["event_id"] == prior[1] and r_.publisher.all == []
            count(test, "2xx the same finish again, nothing published")
            return
        if prior is not None:
            assert r.status == 409, (body[:500], r.status, r.body[:1000])
            assert r_.publisher.all == [] and "One record per rollout attempt" in message, message
            differs = [name for name, attr in (("result", "result_json"), ("final_response_id", "final_response_id"),
                                               ("final_text", "final_text"), ("attempt", "attempt"))
                       if getattr(payload, attr) != getattr(prior[0], attr)]
            assert all(f"'{name}'" in message for name in differs), (differs, message)
            count(test, "409 another finish of a finished rollout")
            return
        assert r.status == 200, (body[:500], r.status, r.body[:1000])
        (event,) = r_.publisher.all
        assert isinstance(event.body, RolloutFinished) and r.json()["event_id"] == event.event_id
        assert event.rollout_id == decoded, (rollout_id, event.rollout_id)
        finished[decoded] = (event.body, event.event_id)
        count(test, "2xx RolloutFinished")
        return
    assert r.status == 400, (body[:500], problem, r.status, r.body[:1000])
    assert r_.publisher.all == [], r_.publisher.all
    if problem in ("body", "unknown"):
        assert NAMES_SOMETHING.search(message), message
    else:
        assert f"'{problem}" in message, (problem, message)  # 'result', or a path in it: 'result[0]...'
    count(test, f"400 {problem}")


@pytest.mark.fuzz
@fuzz_settings()
@given(body=st.one_of(st.fixed_dictionaries({"version": st.one_of(JSON, st.builds(nested, st.integers(
                          min_value=100, max_value=1023)))}).map(_encode_finish),
                      FINISH_BODY.map(_encode_finish), GARBAGE),
       auth=AUTHS, method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
       path=st.sampled_from(["/tokentrail/admin/policy-version"] * 6 + ["/tokentrail/admin/policy-version/",
                             "/tokentrail/admin/", "/tokentrail/admin/weight-version", "/rollouts/", "/rollouts/r-1",
                             "/rollouts/r-1/finish/x", "/rollouts//finish"]))
def test_the_admin_routes_are_never_a_5xx(body, auth, method, path):
    test = "admin"
    r_ = rig("control")
    headers = [] if auth is None else [(b"authorization", auth.encode())]
    r = r_.call(method, path.encode(), body, headers=headers)
    assert r.status < 500, (method, path, auth, body[:300], r.status, r.body[:2000])
    if len(body) > MAX_BODY:  # any method: the limit is admission's, before the token check
        assert r.status == 413, (r.status, r.body[:300])
        count(test, "refused 413")
        return
    if auth != f"Bearer {TOKEN}":
        assert r.status == 401, (auth, r.status)
        count(test, "401 bad token")
        return
    if r.status == 200:
        assert path == "/tokentrail/admin/policy-version" and method == "POST"
        assert isinstance(orjson.loads(body), dict) and "version" in orjson.loads(body)
        count(test, "2xx policy version set")
        return
    message = r.json()["error"]["message"]
    assert NAMES_SOMETHING.search(message), message
    assert r_.publisher.all == []
    count(test, f"{r.status} {r.json()['error']['type']}")


# -- 4. memory stays flat --------------------------------------------------------------------------------

def _random_request(rng: random.Random, serial: int) -> tuple[bytes, bytes]:
    """A seeded fuzzed request (path, body): valid calls, mutated bodies, garbage, refused ids."""
    dialect = rng.choice(list(ROUTES))
    rollout = f"r-{rng.randrange(10_000)}-{serial}" if rng.random() < 0.5 else f"r-{rng.randrange(8)}"
    body = copy.deepcopy(VALID[dialect])
    roll = rng.random()
    if roll < 0.15:
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    elif roll < 0.25:
        rollout = rng.choice(["tab%09x", "a%2Fb", "x" * 300, "-lead"])
        raw = json.dumps(body).encode()
    else:
        if roll < 0.6:
            field = rng.choice(TOP_FIELDS[dialect])
            body[field] = rng.choice(["x", 7, -1, None, [1], {"a": [None]}, "é" * rng.randrange(2_000), True])
        if rng.random() < 0.3:
            body["stream"] = True
        if isinstance(body[ITEMS[dialect]], list) and body[ITEMS[dialect]] and isinstance(body[ITEMS[dialect]][0],
                                                                                            dict):
            body[ITEMS[dialect]][0]["content"] = f"turn {serial} " + "w" * rng.randrange(500)
        raw = json.dumps(body).encode()
    return f"/ng-rollout/{rollout}/training-token-capture{ROUTES[dialect]}".encode(), raw


@pytest.mark.fuzz
def test_the_interceptors_memory_is_flat_over_bursts_of_fuzzed_requests():
    burst = max(300, min(fuzz_examples(), 5_000) // 4)
    r_ = Rig(index_max_rollouts=64)
    rng = random.Random(15_2)
    serial = 0
    statuses: dict[int, int] = {}

    def run_burst() -> None:
        nonlocal serial
        for _ in range(burst):
            serial += 1
            path, raw = _random_request(rng, serial)
            r = r_.call("POST", path, raw)
            assert r.status < 500, (path, raw[:300], r.status, r.body[:500])
            statuses[r.status // 100 * 100] = statuses.get(r.status // 100 * 100, 0) + 1
        r_.reset()

    try:
        run_burst()  # warm-up: caches, the engine catalog, lazily built state
        tracemalloc.start()
        gc.collect()
        first = tracemalloc.take_snapshot()
        run_burst()
        gc.collect()
        second = tracemalloc.take_snapshot()
        run_burst()
        gc.collect()
        third = tracemalloc.take_snapshot()
        tracemalloc.stop()
        index = r_.app.services.core.index
        grown_2 = sum(s.size_diff for s in second.compare_to(first, "filename"))
        grown_3 = sum(s.size_diff for s in third.compare_to(second, "filename"))
        top = "\n".join(str(s) for s in third.compare_to(second, "lineno")[:8])
        for status, n in sorted(statuses.items()):
            COUNTS["memory"][f"{status // 100}xx"] += n
        count("memory", f"burst of {burst}: +{grown_2} B then +{grown_3} B; index {len(index)} rollouts")
        assert len(index) <= 64
        assert grown_3 < 2 * 1024 * 1024, top
        assert grown_3 < max(grown_2, 0) + 512 * 1024, top  # not growing burst over burst
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        r_.close()


# -- regressions of the bugs the fuzz found (both answered 500 before their fix) --

@pytest.mark.parametrize("dialect", ["anthropic", "responses"])
@pytest.mark.parametrize("value", ["x", [1], 5, {"a": 1}, [{"function": "x"}]], ids=json.dumps)
def test_a_tool_calls_key_on_a_non_chat_item_is_never_a_5xx(dialect, value):
    r_ = Rig()
    try:
        body = copy.deepcopy(VALID[dialect])
        body[ITEMS[dialect]][0]["tool_calls"] = value
        r = r_.call("POST", (CAPTURE + ROUTES[dialect]).encode(), json.dumps(body).encode())
        assert r.status < 500, (r.status, r.body)
        if r.status >= 400:
            assert r_.publisher.all == [] and "tool_calls" in error_message(dialect, r.json())
        assert r.status == 400, (r.status, r.body)
    finally:
        r_.close()


def test_a_deeply_nested_policy_version_is_a_400_not_a_recursion_error():
    r_ = Rig()
    try:
        body = b'{"version": ' + b"[" * 1000 + b"]" * 1000 + b"}"
        r = r_.call("POST", b"/tokentrail/admin/policy-version", body, headers=[(b"authorization", b"Bearer s3cret")])
        assert r.status == 400 and "version" in r.json()["error"]["message"], (r.status, r.body[:300])
    finally:
        r_.close()


@pytest.mark.parametrize("version,status,stored", [
    ("step-42", 200, "step-42"), (7, 200, "7"), (None, 200, None),
    ({"a": 1}, 400, None), (True, 400, None), ([1], 400, None), ("x" * 257, 400, None),
])
def test_a_policy_version_is_a_short_label_or_null(version, status, stored):
    """It used to be stored as any JSON value's Python repr ("{'a': 1}", "True"), unbounded."""
    r_ = Rig()
    try:
        r = r_.call("POST", b"/tokentrail/admin/policy-version", json.dumps({"version": version}).encode(),
                    headers=[(b"authorization", b"Bearer s3cret")])
        assert r.status == status, (r.status, r.body[:300])
        if status == 200:
            assert r.json() == {"policy_version": stored}
        else:
            assert "'version'" in r.json()["error"]["message"]
    finally:
        r_.close()
