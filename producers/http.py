"""JSON and error responses in the shape OpenAI-compatible clients expect."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def error_response(status: int, message: str, kind: str) -> Response:
    return json_response({"error": {"message": message, "type": kind, "code": status}}, status)
