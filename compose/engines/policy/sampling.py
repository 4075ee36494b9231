"""vLLM's output budget and sampling-parameter rules, and the ``sampling_params`` it reports.

The budget follows ``get_max_tokens`` (``vllm/entrypoints/serve/utils/api_utils.py``) and
the renderer's ``TokenizeParams`` (``vllm/renderers/params.py``): ``max_tokens`` (or
``max_completion_tokens``, which wins) above ``max_model_len`` is refused, a budget that
does not fit next to the prompt is *clamped* to what is left (vLLM 0.32/0.33 do not refuse
it), an absent one is what is left, and a budget below 1 is refused by ``SamplingParams``.

``render_dump`` is ``SamplingParams`` as vLLM's ``/v1/chat/completions/render`` shows it
(a msgspec struct with ``omit_defaults``): the float parameters always, the others only
when they differ from their defaults.
"""

from __future__ import annotations

import math
from typing import Any

from compose.engines.policy.agent import GenerationParams
from compose.engines.policy.validation import RequestError, field, vllm_error

MAX_N = 16384  # VLLM_MAX_N_SEQUENCES
_EPS = 1e-5  # vLLM's _SAMPLING_EPS: below it sampling is greedy


def budget_key(body: dict) -> str:
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"


def requested_budget(p: dict[str, Any], max_model_len: int) -> int | None:
    """The request's output budget (read by ``read``); refused when it alone exceeds the context window."""
    key, requested = p["budget_key"], p["requested_max_tokens"]
    if requested is not None and requested > max_model_len:
        raise vllm_error(f"{key}={requested} cannot be greater than max_model_len={max_model_len}. "
                         "Please request fewer output tokens.", key, requested)
    return requested


def fitted_budget(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    if max_model_len < prompt_len:
        raise RequestError(f"Input length ({prompt_len}) exceeds model's maximum context length ({max_model_len}).")
    left = max_model_len - prompt_len
    return left if requested is None else min(left, requested)


def read(body: dict) -> dict[str, Any]:
    """The request's sampling fields with vLLM's defaults (their types checked, as pydantic does first)."""
    key = budget_key(body)
    return {
        "n": field(body, "n", int, 1),
        "presence_penalty": field(body, "presence_penalty", float, 0.0),
        "frequency_penalty": field(body, "frequency_penalty", float, 0.0),
        "repetition_penalty": field(body, "repetition_penalty", float, 1.0),
        "temperature": field(body, "temperature", float, 1.0),
        "top_p": field(body, "top_p", float, 1.0),
        "top_k": field(body, "top_k", int, 0),
        "min_p": field(body, "min_p", float, 0.0),
        "seed": field(body, "seed", int),
        "stop": _stop(body),
        "stop_token_ids": field(body, "stop_token_ids", list, []),
        "ignore_eos": field(body, "ignore_eos", bool, False),
        "min_tokens": field(body, "min_tokens", int, 0),
        "skip_special_tokens": field(body, "skip_special_tokens", bool, True),
        "include_stop_str_in_output": field(body, "include_stop_str_in_output", bool, False),
        "budget_key": key,
        "requested_max_tokens": field(body, "max_tokens", int) if key == "max_tokens" else
        field(body, "max_completion_tokens", int),
    }


def verify(p: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """``SamplingParams._verify_args`` on the fitted budget; returns ``p`` with ``max_tokens`` set."""
    p["max_tokens"] = max_tokens
    n = p["n"]
    if n < 1:
        raise vllm_error(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise vllm_error(f"n must be at most {MAX_N}, got {n}. To increase this limit, set the "
                         "VLLM_MAX_N_SEQUENCES environment variable.")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2.0 <= p[name] <= 2.0:
            raise vllm_error(f"{name} must be in [-2, 2], got {p[name]}.")
    if not math.isfinite(p["repetition_penalty"]):
        raise vllm_error(f"repetition_penalty must be a finite number, got {p['repetition_penalty']}.")
    if p["repetition_penalty"] <= 0.0:
        raise vllm_error(f"repetition_penalty must be greater than zero, got {p['repetition_penalty']}.")
    t = p["temperature"]
    if not math.isfinite(t):
        raise vllm_error(f"temperature must be a finite number, got {t}.", "temperature", t)
    if t < 0.0:
        raise vllm_error(f"temperature must be non-negative, got {t}.", "temperature", t)
    if t > 2.0:
        raise vllm_error(f"temperature must be in [0, 2], got {t}.", "temperature", t)
    if not 0.0 < p["top_p"] <= 1.0:
        raise vllm_error(f"top_p must be in (0, 1], got {p['top_p']}.", "top_p", p["top_p"])
    if p["top_k"] < -1:
        raise vllm_error(f"top_k must be 0 (disable), or at least 1, got {p['top_k']}.")
    if not 0.0 <= p["min_p"] <= 1.0:
        raise vllm_error(f"min_p must be in [0, 1], got {p['min_p']}.")
    if max_tokens < 1:
        raise vllm_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if p["min_tokens"] < 0:
        raise vllm_error(f"min_tokens must be greater than or equal to 0, got {p['min_tokens']}.")
    if p["min_tokens"] > max_tokens:
        raise vllm_error(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {p['min_tokens']}.")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in p["stop_token_ids"]):
        raise vllm_error(f"stop_token_ids must contain only integers, got {p['stop_token_ids']}.")
    if any(not s for s in p["stop"]):
        raise vllm_error("stop cannot contain an empty string.")
    if t < _EPS:  # greedy
        p.update(top_p=1.0, top_k=0, min_p=0.0)
    return p


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("1 validation error:\n  {'type': 'string_type', 'loc': 'body.stop', 'msg': "
                           "'Input should be a valid string', 'input': " + repr(str(stop)) + "}",
                           err_type="Bad Request", param="body.stop")
    return list(stop)


def generation_params(p: dict[str, Any], vocab_size: int, *, reasoning: bool, drift: bool, repetition: bool,
                      forced_json: bool, weight_version: int, weight_label: str) -> GenerationParams:
    top_k = p["top_k"]
    return GenerationParams(
        max_tokens=p["max_tokens"], temperature=p["temperature"], top_p=p["top_p"],
        top_k=top_k if top_k > 0 else 0, ignore_eos=p["ignore_eos"], stop=tuple(p["stop"]),
        stop_token_ids=tuple(t for t in p["stop_token_ids"] if 0 <= t < vocab_size),
        reasoning=reasoning, drift=drift, repetition=repetition, forced_json=forced_json,
        weight_version=weight_version, weight_label=weight_label,
    )


def render_dump(p: dict[str, Any], *, stream: bool, logprobs: int | None, prompt_logprobs: int | None,
                skip_special_tokens: bool, extra_args: dict | None) -> dict[str, Any]:
    """``SamplingParams`` as ``GenerateRequest.model_dump()`` shows it (module docstring)."""
    out: dict[str, Any] = {}
    if p["n"] != 1:
        out["n"] = p["n"]
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p"):
        out[name] = float(p[name])
    if p["top_k"] != 0:
        out["top_k"] = p["top_k"]
    out["min_p"] = float(p["min_p"])
    if p["seed"] is not None:
        out["seed"] = p["seed"]
    out["stop"] = list(p["stop"])
    out["stop_token_ids"] = list(p["stop_token_ids"])
    if p["ignore_eos"]:
        out["ignore_eos"] = True
    out["max_tokens"] = p["max_tokens"]
    if p["min_tokens"]:
        out["min_tokens"] = p["min_tokens"]
    if logprobs is not None:
        out["logprobs"] = logprobs
    if prompt_logprobs is not None:
        out["prompt_logprobs"] = prompt_logprobs
    if not skip_special_tokens:
        out["skip_special_tokens"] = False
    if p["include_stop_str_in_output"]:
        out["include_stop_str_in_output"] = True
    out["output_kind"] = 1 if stream else 2  # RequestOutputKind.DELTA / FINAL_ONLY
    out["skip_clone"] = True
    if p["stop_token_ids"]:
        out["_all_stop_token_ids"] = sorted(set(p["stop_token_ids"]))
    if extra_args:
        out["extra_args"] = extra_args
    out["bad_words"] = []
    out["skip_reading_prefix_cache"] = prompt_logprobs is not None
    return out
