"""``announce_version``'s engine leg: the label vLLM gets, and refusals named (a real local HTTP server, no broker)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import confluent_kafka
import pytest

from schemas.errors import ContractError, TransportError
from schemas.kafka.versions import AnnounceFailed, _watermarks, announce_version, label_engine

UNREACHABLE_BROKER = "127.0.0.1:1"  # an announcement that got this far would fail naming it


@pytest.fixture
def engine():
    """A stand-in engine answering POST /update_weight_version with ``state.status``; requests recorded."""
    state = type("State", (), {"status": 200, "seen": []})()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.seen.append((self.path, self.headers.get("Authorization"), json.loads(body)))
            self.send_response(state.status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"no")

        def log_message(self, *_a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/"
    yield state
    server.shutdown()
    server.server_close()


def test_the_engine_gets_the_label_as_vllm_expects(engine):
    label_engine(engine.url, "step-4", api_key="secret")
    assert engine.seen == [("/update_weight_version", "Bearer secret", {"new_version": "step-4"})]


def test_an_engine_without_dev_mode_is_named_and_nothing_is_published(engine):
    engine.status = 404
    with pytest.raises(AnnounceFailed, match="VLLM_SERVER_DEV_MODE=1") as exc:
        announce_version(UNREACHABLE_BROKER, "step-4", 4, engine_url=engine.url, timeout_s=5)
    assert UNREACHABLE_BROKER not in str(exc.value)  # refused before the broker was tried
    assert isinstance(exc.value, TransportError)


def test_another_refusal_carries_the_status_and_the_label(engine):
    engine.status = 500
    with pytest.raises(AnnounceFailed, match=r"refused the label 'v9': HTTP 500 no"):
        label_engine(engine.url, "v9")


def test_an_unreachable_engine_is_named():
    with pytest.raises(AnnounceFailed, match=r"http://127.0.0.1:1/update_weight_version unreachable"):
        label_engine("http://127.0.0.1:1", "v1", timeout_s=5)


def test_an_invalid_announcement_is_refused_before_any_io(engine):
    with pytest.raises(ContractError, match="step=-1"):
        announce_version(UNREACHABLE_BROKER, "v1", -1, engine_url=engine.url)
    assert engine.seen == []


class _FlakyOffsets:
    """A consumer whose end-offset reads fail with ``errors`` (in order) before answering."""

    def __init__(self, *errors: int) -> None:
        self.errors, self.calls = list(errors), 0

    def get_watermark_offsets(self, tp, timeout):
        self.calls += 1
        if self.errors:
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(self.errors.pop(0)))
        return 0, 7


def test_a_partition_without_a_leader_yet_is_waited_for():
    # The CI failure this pins: NOT_LEADER_FOR_PARTITION right after the topic was created.
    flaky = _FlakyOffsets(confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION,
                          confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE)
    assert _watermarks(flaky, None, deadline=time.monotonic() + 5) == (0, 7)
    assert flaky.calls == 3


def test_a_lasting_or_non_retriable_offset_error_is_raised():
    with pytest.raises(confluent_kafka.KafkaException):
        _watermarks(_FlakyOffsets(confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED), None,
                    deadline=time.monotonic() + 5)
    lasting = _FlakyOffsets(*[confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(confluent_kafka.KafkaException):
        _watermarks(lasting, None, deadline=time.monotonic() + 0.5)
    assert 1 < lasting.calls < 100
