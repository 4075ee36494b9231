"""The engine's dev-mode label route as ``tokentrail versions announce --engine`` uses it: the label vLLM
gets, and refusals named (a real local HTTP server, no broker)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from compose import cli
from compose.engines.vllm_rig.admin import WeightPushError, set_version
from schemas.errors import TransportError

UNREACHABLE_BROKER = "127.0.0.1:1"  # an announcement that got this far would fail naming it


@pytest.fixture
def engine():
    """A stand-in engine answering POST /update_weight_version with ``state.status``; requests recorded."""
    state = type("State", (), {"status": 200, "seen": []})()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.seen.append((self.path, self.headers.get("Authorization"), json.loads(body)))
            answer = b"{}" if state.status == 200 else b"no"  # vLLM's success is JSON; a refusal may be text
            self.send_response(state.status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/"
    yield state
    server.shutdown()
    server.server_close()


def test_the_engine_gets_the_label_as_vllm_expects(engine):
    set_version(engine.url, "step-4", api_key="secret")
    assert engine.seen == [("/update_weight_version", "Bearer secret", {"new_version": "step-4"})]


def test_an_engine_without_dev_mode_is_named_and_nothing_is_published(engine, capsys, monkeypatch):
    engine.status = 404
    # The topic is read first (issue 26: a label re-announced with another step is refused before the engine
    # is labelled); here it holds nothing, so the engine is asked next and refuses.
    monkeypatch.setattr("compose.ops.versions.announced_steps", lambda bootstrap, topic, security=None: {})
    with pytest.raises(WeightPushError, match="VLLM_SERVER_DEV_MODE=1") as exc:
        set_version(engine.url, "step-4")
    assert isinstance(exc.value, TransportError)
    rc = cli.main(["versions", "announce", "step-4", "--step", "4", "--engine", engine.url,
                   "--bootstrap", UNREACHABLE_BROKER])
    err = capsys.readouterr().err
    assert rc == 3 and "VLLM_SERVER_DEV_MODE=1" in err
    assert UNREACHABLE_BROKER not in err  # refused before the broker was tried


def test_another_refusal_carries_the_status_and_the_label(engine):
    engine.status = 500
    with pytest.raises(WeightPushError, match=r"did not take the label 'v9'.*answered 500: no"):
        set_version(engine.url, "v9")


def test_an_unreachable_engine_is_named():
    with pytest.raises(WeightPushError, match=r"/update_weight_version on http://127.0.0.1:1 failed.*is the engine running"):
        set_version("http://127.0.0.1:1", "v1", timeout=5)
