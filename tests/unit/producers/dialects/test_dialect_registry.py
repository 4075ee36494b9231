"""The dialect registry is the one table: its checks, its lookups, and the ids it mints."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from producers.dialects.base import DialectAdapter
from producers.dialects.common import DialectError
from producers.dialects.registry import ADAPTER_METHODS, DIALECTS, DialectRegistry, PathMatch
from schemas.errors import ConfigError, TokentrailError
from schemas.ids import call_id_from_response_id
from schemas.records import Dialect

CHAT = DIALECTS.get("chat")


def test_the_built_in_dialects():
    assert [(s.name, s.path, s.response_id_prefix, s.stream_usage) for s in DIALECTS] == [
        ("chat", "/v1/chat/completions", "chatcmpl-", False), ("anthropic", "/v1/messages", "msg_", True),
        ("responses", "/v1/responses", "resp_", True),
        ("google", "/{version}/models/{model}:generateContent", "gen_", True)]
    adapters = DIALECTS.load_adapters()
    assert list(adapters) == ["chat", "anthropic", "responses", "google"]
    assert all(adapter.spec is DIALECTS.get(name) for name, adapter in adapters.items())
    assert DIALECTS.get("google").wire is Dialect.GOOGLE_GENERATE_CONTENT


def test_a_path_pattern_names_the_model_and_whether_the_call_streams_or_counts():
    google = DIALECTS.get("google")
    assert DIALECTS.match("/v1beta/models/gemini-2.5-pro:generateContent") == PathMatch(google, "gemini-2.5-pro",
                                                                                          False, False)
    assert DIALECTS.match("/v1/models/gemini-2.5-pro:streamGenerateContent/") == PathMatch(google, "gemini-2.5-pro",
                                                                                           True, False)
    assert DIALECTS.match("/v1beta/models/m_1.x:countTokens") == PathMatch(google, "m_1.x", False, True)
    assert DIALECTS.for_path("/v1beta/models/m:streamGenerateContent") is google
    assert DIALECTS.for_path("/v1beta/models/m:countTokens") is None  # counting generates nothing
    assert DIALECTS.match("/v1/messages") == PathMatch(DIALECTS.get("anthropic"), None, False, False)
    for path in ("/v1beta/models/org/m:generateContent", "/v1beta/models/a:b:generateContent",
                 "/v1beta/models/..:generateContent", "/v1beta/models/-x:generateContent",
                 "/v1beta/models/" + "m" * 129 + ":generateContent", "/v1beta/models/m:generateContentX",
                 "/api/v1beta/models/m:generateContent"):
        assert DIALECTS.match(path) is None, path
    # Error shapes: the dialect a refused path resembles, even with a model the pattern refuses.
    assert DIALECTS.for_suffix("/ng-rollout/r/training-token-capture/v1beta/models/org/m:countTokens") is google


@pytest.mark.parametrize("bad", ["/v1/{model}/{model}:x", "/v1/{name}:x", "/v1/{model:x", "/v1/{version}/{version}"])
def test_a_malformed_pattern_is_refused(bad):
    with pytest.raises(ConfigError, match="once each"):
        DialectRegistry([dataclasses.replace(CHAT, path=bad)])


def test_a_stream_or_count_path_clashes_like_a_path():
    google = DIALECTS.get("google")
    clone = dataclasses.replace(google, name="g2", response_id_prefix="g2-", path="/v9/x",
                                stream_path="/v9/y", count_path=google.count_path)
    with pytest.raises(ConfigError, match="already registered by dialect 'google'"):
        DialectRegistry([*DIALECTS, clone])


def test_a_counting_dialect_needs_an_adapter_that_counts():
    spec = dataclasses.replace(CHAT, count_path="/v1/count")
    with pytest.raises(ConfigError, match="lacks count_request, count_response"):
        DialectRegistry([spec]).load_adapters()


def test_lookups_by_path_and_suffix():
    assert DIALECTS.for_path("/v1/messages/") is DIALECTS.get("anthropic")
    assert DIALECTS.for_path("/v1/messages/count_tokens") is None
    assert DIALECTS.for_suffix("/ng-rollout/r/training-token-capture/v1/responses") is DIALECTS.get("responses")
    assert DIALECTS.for_suffix("/v1/models") is None


@pytest.mark.parametrize("clash", [dict(name="chat"), dict(path="/v1/messages"), dict(response_id_prefix="resp_")])
def test_a_clash_is_refused(clash):
    spec = dataclasses.replace(CHAT, **{"name": "x", "path": "/v1/x", "response_id_prefix": "x-", **clash})
    with pytest.raises(ConfigError, match="already registered"):
        DialectRegistry([*DIALECTS, spec])


@pytest.mark.parametrize("bad", [dict(response_id_prefix="x"), dict(response_id_prefix="-x-"), dict(path="v1/x"),
                                 dict(path="/v1/x/"), dict(wire="CHAT_COMPLETIONS")])
def test_a_malformed_spec_is_refused(bad):
    with pytest.raises(ConfigError, match="dialect 'x'"):
        DialectRegistry([dataclasses.replace(CHAT, **{"name": "x", "path": "/v1/x", "response_id_prefix": "x-",
                                                      **bad})])


@pytest.mark.parametrize("target", ["producers.dialects.chat:Nope", "producers.nope:ChatAdapter", "no-colon",
                                    "producers.dialects.common:DialectError"])
def test_an_adapter_that_cannot_load_fails_naming_it(target):
    with pytest.raises(ConfigError, match=target.replace(".", r"\.")):
        DialectRegistry([dataclasses.replace(CHAT, adapter=target)]).load_adapters()


def test_the_protocol_and_the_startup_check_agree():
    declared = {name for name, _ in inspect.getmembers(DialectAdapter, inspect.isfunction) if not name.startswith("_")}
    assert declared == set(ADAPTER_METHODS)


def test_any_registered_prefix_is_read_back():
    call_id = "0123456789abcdef" * 2
    for prefix in ("chatcmpl-", "msg_", "resp_", "gen_", "toy-", "my_dialect-"):
        spec = DialectRegistry([dataclasses.replace(CHAT, response_id_prefix=prefix)]).get("chat")
        assert call_id_from_response_id(spec.response_id(call_id)) == call_id
    assert call_id_from_response_id("engine-xyz") is None and call_id_from_response_id("tt" + call_id) is None


def test_dialect_errors_are_ours_and_value_errors():
    assert issubclass(DialectError, ValueError) and issubclass(DialectError, TokentrailError)


def test_the_registry_and_the_translators_import_no_framework():
    code = ("import sys, producers.dialects.registry, producers.dialects.chat_chunks, producers.dialects.base, "
            "producers.dialects.google\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'httpx', 'orjson'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[4])
    assert out.stdout.strip() == "[]"
