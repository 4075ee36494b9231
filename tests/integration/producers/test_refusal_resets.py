"""A refused request with a large body gets its refusal, never a TCP reset (issue 26, finding 7).

The interceptor refuses a bad path or route before reading the body. Closing the connection with body
bytes unread made the kernel reset it: with a 1 MB body and ``Connection: close``, every refusal here
reached the client as ``ECONNRESET`` after (or instead of) its status line. Now the rest of the body is
read and discarded first (``producers.http.admission.drain``). Real uvicorn, raw sockets: what a client
library sees is what the kernel delivers.
"""

from __future__ import annotations

import json
import socket
import uuid
from urllib.parse import urlparse

import pytest

from compose.rig.stack import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.real_broker]

REFUSED = {  # path -> the status its refusal has, each decided before the body is read
    "/v1/models/../tokentrail/admin/weight-version": 400,  # a dot segment
    "/ng-rollout/r1/training-token-capture/v1/nope": 404,  # no such capture route
    "/nope": 404,  # no such route
}


def _post(url: str, path: str, size: int) -> tuple[str, bytes]:
    """POST ``size`` bytes with Connection: close; (status line, body), or ("RESET", what came before it)."""
    u = urlparse(url)
    data = b""
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        head = (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n"
                "Connection: close\r\n\r\n").encode()
        try:
            s.sendall(head + b" " * size)
            while chunk := s.recv(65536):
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            return "RESET", data
    status, _, rest = data.partition(b"\r\n")
    return status.decode(), rest.partition(b"\r\n\r\n")[2]


def test_refusals_of_a_1_mb_body_arrive_whole_and_never_as_a_reset(kafka_bootstrap, tmp_path):
    with LocalStack(kafka_bootstrap, tmp_path, topic_prefix=f"rr{uuid.uuid4().hex[:8]}.", with_pipeline=False) as st:
        for path, status in REFUSED.items():
            for _ in range(5):
                line, body = _post(st.interceptor_url, path, 1_000_000)
                assert line.startswith(f"HTTP/1.1 {status} "), (path, line, body)
                assert json.loads(body)["error"]["message"], (path, body)  # the whole error, not a cut one
