"""A finish the processor could not store is refused where it comes in, naming the field (never a 200).

Regression: ``attempt`` 2**31 (an Avro ``int`` holds 32 bits) was answered 200, the event was
dead-lettered by the processor and the rollout never delivered; a negative or non-integer
attempt was coerced (``int("3")``, ``int(1.5)``) or answered a bare 500 (``[1]``), and so was a
non-string ``final_text`` / ``final_response_id`` (the codec refused it after the 200 path
had started).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from producers import finish_cli
from producers.finish import finish_rollout, finished_event_body
from schemas.codec import decode_event, encode_event
from schemas.errors import ContractError
from schemas.records import RolloutFinished

AUTH = {"authorization": "Bearer s3cret"}
FINISH = "/rollouts/r-1/finish"


def test_importing_the_finish_api_pulls_in_no_http_framework():
    """A trainer calling finish_rollout imports the Kafka client, never the interceptor's web stack."""
    code = ("import json, sys; import producers.finish\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'httpx', 'uvicorn'})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


# (payload, the field the 400 must name)
BAD_FINISH = [
    ({"attempt": 2**31}, "attempt"),
    ({"attempt": 2**40}, "attempt"),
    ({"attempt": -1}, "attempt"),
    ({"attempt": "3"}, "attempt"),
    ({"attempt": 1.5}, "attempt"),
    ({"attempt": 2.0}, "attempt"),
    ({"attempt": True}, "attempt"),
    ({"attempt": [1]}, "attempt"),
    ({"attempt": {"n": 1}}, "attempt"),
    ({"final_text": 5}, "final_text"),
    ({"final_text": ["done"]}, "final_text"),
    ({"final_text": {"text": "done"}}, "final_text"),
    ({"final_text": True}, "final_text"),
    ({"final_response_id": 7}, "final_response_id"),
    ({"final_response_id": {"id": "x"}}, "final_response_id"),
    ({"result": deep(300)}, "result"),
    ({"result": {"reward": 1, "trace": deep(250)}}, "result.trace"),
    ({"reward": 1}, "reward"),  # unknown field
]


@pytest.mark.parametrize("payload, field", BAD_FINISH, ids=[f"{f}={str(p)[:30]}" for p, f in BAD_FINISH])
async def test_a_finish_field_the_schema_cannot_hold_is_a_400_naming_it(interceptor, publisher, payload, field):
    r = await interceptor.post(FINISH, content=json.dumps(payload), headers=AUTH)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert field in message, message
    assert publisher.events == []


@pytest.mark.parametrize("raw, needle", [
    (b"[1, 2]", "JSON object"),
    (b'"done"', "JSON object"),
    (b"{not json", "not valid JSON"),
    (b"[" * 1100 + b"]" * 1100, "1024 levels"),
    (b'{"result": ' + b"[" * 600 + b"]" * 600 + b"}", "result"),
])
async def test_a_finish_body_that_cannot_be_read_is_a_400_saying_why(interceptor, publisher, raw, needle):
    r = await interceptor.post(FINISH, content=raw, headers=AUTH)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert publisher.events == []


@pytest.mark.parametrize("payload, attempt", [({}, 0), ({"attempt": None}, 0), ({"attempt": 0}, 0),
                                              ({"attempt": 2**31 - 1}, 2**31 - 1)])
async def test_every_attempt_the_schema_holds_is_accepted(interceptor, publisher, payload, attempt):
    r = await interceptor.post(FINISH, json={"result": {"reward": 0.5}, "final_text": "ok",
                                             "final_response_id": None, **payload}, headers=AUTH)
    assert r.status_code == 200, r.text
    (event,) = publisher.events
    assert isinstance(event.body, RolloutFinished) and event.body.attempt == attempt
    # what was acknowledged decodes to the same values (the processor will not dead-letter it)
    assert decode_event(encode_event(event)).body == event.body


@pytest.mark.parametrize("kwargs, field", [
    ({"attempt": 2**31}, "attempt"), ({"attempt": -5}, "attempt"), ({"attempt": True}, "attempt"),
    ({"final_text": b"bytes"}, "final_text"), ({"final_text": "lone \udc80 surrogate"}, "final_text"),
    ({"final_response_id": 3}, "final_response_id"), ({"result": {"r": float("nan")}}, "result"),
])
async def test_the_python_api_refuses_them_before_publishing(kwargs, field):
    class NoPublish:
        async def publish(self, topic, event):  # pragma: no cover - must not be reached
            raise AssertionError("published an invalid finish")

    with pytest.raises(ContractError, match=field):
        await finish_rollout("unused:1", "r-1", publisher=NoPublish(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match=field):
        finished_event_body(kwargs.pop("result", None), **kwargs)


@pytest.mark.parametrize("argv, needle", [
    (["--attempt", str(2**31)], "attempt"),
    (["--attempt", "-1"], "attempt"),
    (["--result", "[" * 1500 + "]" * 1500], "--result"),
    (["--result", "{oops"], "--result"),
])
def test_the_cli_refuses_them_with_exit_2_naming_the_field(capsys, argv, needle):
    parser = argparse.ArgumentParser()
    finish_cli.configure(parser)
    args = parser.parse_args(["--bootstrap", "127.0.0.1:1", "--rollout", "r-1", *argv])
    assert finish_cli.main(args) == 2  # refused before any broker is contacted
    assert needle in capsys.readouterr().err
