"""Dialect translation: Anthropic Messages, OpenAI Responses and Gemini to and from chat completions.

The interceptor captures tokens from vLLM's chat-completions answer (the only vLLM 0.33
endpoint that returns token ids for every dialect), so a harness speaking another dialect
is translated on the way up and back:

* ``anthropic``: ``to_chat_request``, ``dropped_keys``, ``hash_items``,
  ``from_chat_response``, ``StreamTranslator``, ``encode_sse``;
* ``responses``: the same names (``from_chat_response`` and ``StreamTranslator`` also take
  the original ``request``, whose settings the Response object echoes);
* ``google``: the same names (``to_chat_request`` also takes the ``model`` and ``stream`` its
  path says), and ``count_chat_request`` for ``:countTokens``; ``google_config`` translates
  tools and ``generationConfig``, ``google_names`` reads proto (snake_case) field names.

The package is also every dialect's home: ``registry`` (the one table of dialects: path,
wire symbol, response-id prefix, adapter), ``base`` (the adapter contract), ``chat``
(the chat adapter), ``anthropic_adapter`` / ``responses_adapter`` / ``google_adapter`` (the HTTP adapters over
the translators) and ``chat_chunks`` (the one reader of the engine's stream chunks).

Guarantees: the translators (``anthropic``, ``responses``, ``google`` and their ``_output`` /
``_stream`` / ``_config`` / ``_names`` parts, ``common``, ``chat_chunks``) and ``registry`` are pure (stdlib and
``schemas`` only; no HTTP framework); ``chat`` and the ``*_adapter`` modules are the only
ones here that use starlette, and importing the package pulls none of them in. Nothing the
translators emit carries a token field (``prompt_token_ids``, ``token_ids``, ``logprobs``);
whatever cannot be translated faithfully raises ``DialectError`` (a ``ValueError``) naming it, which the
interceptor answers with 400 (request) or treats as an upstream failure (answer).
"""

from __future__ import annotations

from producers.dialects import anthropic, google, responses
from producers.dialects.common import DialectError, encode_sse

__all__ = ["DialectError", "anthropic", "encode_sse", "google", "responses"]
