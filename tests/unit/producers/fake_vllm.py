"""A scripted vLLM 0.32-shaped engine for httpx.MockTransport: the routes and texts the interceptor meets.

Routes: GET /v1/models (ids, max_model_len), POST /v1/chat/completions (non-streaming and SSE,
``return_token_ids``, ``kv_transfer_params.prompt_token_ids``, ``weight_versions``),
POST /v1/chat/completions/render (GenerateRequest dump: ``token_ids``), POST /tokenize.

Template (Qwen-like): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message; assistant
reasoning is dropped from history (as Qwen3 templates drop it), so a re-rendered history does not
extend the ids that were sampled (``<think> ... </think>`` + answer + ``<|im_end|>``, the EOS).
Error texts are vLLM's (renderers/params.py, models/serving.py); ``context_style`` picks which.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

SPECIAL = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "\n")
EOS = 2
_TOKEN = re.compile(r"<\|im_start\|>|<\|im_end\|>|<think>|</think>|\n|[^\s<]+|<")


class FakeVLLM:
    def __init__(self, *, served: tuple[str, ...] = ("qwen-policy",), max_model_len: int = 4096,
                 honour_kv: bool = True, has_render: bool = True, context_style: str = "vllm032",
                 api_key: str | None = None, weight_version: str = "default") -> None:
        self.served, self.max_model_len = served, max_model_len
        self.honour_kv, self.has_render, self.context_style = honour_kv, has_render, context_style
        self.api_key, self.weight_version = api_key, weight_version
        self.vocab: dict[str, int] = {t: i + 1 for i, t in enumerate(SPECIAL)}
        self.requests: list[dict[str, Any]] = []  # every request: method, path, body, headers
        self.finish: list[str] = []  # finish reasons for the next generations (default: stop)
        self.logprobs: list[float] = []  # log-probs replacing the first ones of the next generation
        self.models_status = 200
        self.raise_on: dict[str, BaseException] = {}  # path -> exception the transport raises
        self.turn = 0

    # -- tokenizer and template ----------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(t, len(self.vocab) + 1) for t in _TOKEN.findall(text)]

    def render(self, messages: list[dict], tools: Any = None, *, add_generation_prompt: bool = True) -> list[int]:
        text = ""
        if tools:
            text += "<|im_start|>system\ntools: " + " ".join(t["function"]["name"] for t in tools) + "<|im_end|>\n"
        for m in messages:
            content = m.get("content") or ""
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content)
            for call in m.get("tool_calls") or ():
                content += " call " + call["function"]["name"] + " " + call["function"]["arguments"]
            text += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text)

    # -- transport -----------------------------------------------------------------------
    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(self.handler))

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]

    def bodies(self, path: str = "/v1/chat/completions") -> list[dict]:
        return [r["body"] for r in self.requests if r["path"] == path]

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"null")
        self.requests.append({"method": request.method, "path": request.url.path, "body": body,
                              "headers": dict(request.headers)})
        if request.url.path in self.raise_on:
            raise self.raise_on[request.url.path]
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        route = {("GET", "/v1/models"): self._models, ("POST", "/v1/chat/completions"): self._chat,
                 ("POST", "/tokenize"): self._tokenize}
        if self.has_render:
            route[("POST", "/v1/chat/completions/render")] = self._render
        handler = route.get((request.method, request.url.path))
        if handler is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return handler(body)

    def _models(self, body: Any) -> httpx.Response:
        if self.models_status != 200:
            return httpx.Response(self.models_status, json={"error": {"message": "down", "code": self.models_status}})
        return httpx.Response(200, json={"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "vllm", "root": m, "max_model_len": self.max_model_len}
            for m in self.served]})

    def _check_model(self, body: dict) -> httpx.Response | None:
        model = body.get("model")
        if model and model not in self.served:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return None

    def _render(self, body: dict) -> httpx.Response:
        if (refused := self._check_model(body)) is not None:
            return refused
        ids = self.render(body["messages"], body.get("tools"),
                          add_generation_prompt=body.get("add_generation_prompt", True))
        return httpx.Response(200, json={"request_id": "chatcmpl-render", "token_ids": ids, "features": None,
                                         "sampling_params": {}, "model": body.get("model"), "stream": False})

    def _tokenize(self, body: dict) -> httpx.Response:
        ids = self.render(body["messages"], body.get("tools"),
                          add_generation_prompt=body.get("add_generation_prompt", True))
        return httpx.Response(200, json={"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

    def _chat(self, body: dict) -> httpx.Response:
        if (refused := self._check_model(body)) is not None:
            return refused
        kv = body.get("kv_transfer_params") or {}
        if self.honour_kv and kv.get("prompt_token_ids"):
            prompt = list(kv["prompt_token_ids"])
        else:
            prompt = self.render(body["messages"], body.get("tools"))
        limit = self._max_tokens(body, len(prompt))
        if isinstance(limit, httpx.Response):
            return limit
        self.turn += 1
        reasoning, content = ["step", str(self.turn)], ["answer", str(self.turn)]
        gen = [self.vocab["<think>"], *self.encode(" ".join(reasoning)), self.vocab["</think>"],
               *self.encode(" ".join(content)), EOS]
        finish, stop_reason = (self.finish.pop(0) if self.finish else "stop"), None
        if finish != "stop":
            gen = gen[:-1]  # an aborted or repetitive generation has no EOS
        if len(gen) > limit:
            gen, finish = gen[:limit], "length"
        lps = [-0.125 * (i + 1) for i in range(len(gen))]
        lps[: len(self.logprobs)] = self.logprobs[: len(gen)]
        self.logprobs = []
        message = {"role": "assistant", "content": " ".join(content), "reasoning": " ".join(reasoning)}
        versions = [{"version": self.weight_version, "start": 0, "end": len(gen)}]
        if body.get("stream"):
            return self._sse(body, prompt, gen, lps, message, finish, versions)
        choice = {"index": 0, "message": message, "finish_reason": finish, "stop_reason": stop_reason,
                  "token_ids": gen, "weight_versions": versions if body.get("return_weight_versions") else None,
                  "logprobs": {"content": [{"token": f"t{t}", "logprob": lp, "bytes": [], "top_logprobs": []}
                                           for t, lp in zip(gen, lps)]} if body.get("logprobs") else None}
        return httpx.Response(200, json={
            "id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": body.get("model") or self.served[0],
            "choices": [choice], "prompt_token_ids": prompt if body.get("return_token_ids") else None,
            "kv_transfer_params": None,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen)}})

    def _sse(self, body, prompt, gen, lps, message, finish, versions) -> httpx.Response:
        model = body.get("model") or self.served[0]

        def chunk(choice: dict, **top: Any) -> bytes:
            data = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": model,
                    "choices": [{"index": 0, "logprobs": None, "finish_reason": None, **choice}], **top}
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        out = [chunk({"delta": {"role": "assistant", "content": ""}}, prompt_token_ids=prompt)]
        parts = [("reasoning", message["reasoning"]), ("content", message["content"])]
        for i, (token, lp) in enumerate(zip(gen, lps)):
            delta = {parts[0][0]: parts[0][1]} if i == 1 else {parts[1][0]: parts[1][1]} if i == 5 else {}
            last = i == len(gen) - 1
            extra = {"finish_reason": finish, "stop_reason": None, "weight_versions": versions} if last else {}
            out.append(chunk({"delta": delta, "token_ids": [token],
                              "logprobs": {"content": [{"token": f"t{token}", "logprob": lp}]}, **extra}))
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append(b"data: " + json.dumps({"id": "chatcmpl-x", "object": "chat.completion.chunk", "choices": [],
                                               "usage": {"prompt_tokens": len(prompt),
                                                         "completion_tokens": len(gen)}}).encode() + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return httpx.Response(200, content=b"".join(out), headers={"content-type": "text/event-stream"})

    def _max_tokens(self, body: dict, prompt_len: int) -> int | httpx.Response:
        """vLLM's budget rule, or the refusal it answers with (texts from vllm/renderers/params.py)."""
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        asked, limit = body.get(key), self.max_model_len
        if self.context_style == "vllm032":
            if asked is not None and asked > limit:
                return _error(400, f"{key}={asked} cannot be greater than max_model_len={limit}. "
                                   "Please request fewer output tokens.", param=key)
            if prompt_len > limit:
                return _error(400, f"This model's maximum context length is {limit} tokens. However, your prompt "
                                   f"contains {prompt_len} input tokens, which exceeds this limit even without any "
                                   "output tokens. Please reduce the length of the input prompt.", param="input_tokens")
            return min(limit - prompt_len, asked if asked is not None else limit)
        if asked is not None and prompt_len + asked > limit:
            if self.context_style == "requested":
                return _error(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                   f"{prompt_len + asked} tokens ({prompt_len} in the messages, {asked} in the "
                                   "completion). Please reduce the length of the messages or completion.", param=key)
            return _error(400, f"This model's maximum context length is {limit} tokens. Please shorten the "
                               "request.", param=key)
        return asked if asked is not None else limit - prompt_len


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": kind, "param": param, "code": status}})
