"""Dialect translation: Anthropic Messages and OpenAI Responses to and from chat completions.

The interceptor captures tokens from vLLM's chat-completions answer (the only vLLM 0.33
endpoint that returns token ids for every dialect), so a harness speaking another dialect
is translated on the way up and back:

* ``anthropic``: ``to_chat_request``, ``dropped_keys``, ``hash_items``,
  ``from_chat_response``, ``StreamTranslator``, ``encode_sse``;
* ``responses``: the same names (``from_chat_response`` and ``StreamTranslator`` also take
  the original ``request``, whose settings the Response object echoes).

Guarantees: every module here is pure (stdlib only; no HTTP framework); nothing they emit
carries a token field (``prompt_token_ids``, ``token_ids``, ``logprobs``); whatever cannot
be translated faithfully raises ``DialectError`` (a ``ValueError``) naming it, which the
interceptor answers with 400 (request) or treats as an upstream failure (answer).
"""

from __future__ import annotations

from producers.dialects import anthropic, responses
from producers.dialects.common import DialectError, encode_sse

__all__ = ["DialectError", "anthropic", "encode_sse", "responses"]
