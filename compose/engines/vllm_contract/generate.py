"""Write the description of a vLLM release's wire models from its wheel: ``vllm-<version>.json`` beside this file.

    python -m compose.engines.vllm_contract.generate --wheel 0.34.0          # downloads the wheel once
    python -m compose.engines.vllm_contract.generate --wheel path/to/vllm-0.34.0-...whl

What it records (``SOURCES``, ``ROUTES``, ``SERIALIZATION``): the pydantic, dataclass,
msgspec and enum classes tokentrail's requests and the engine's answers are made of (chat
completions request, response, stream chunk, choice, message, delta, log-prob, usage, error;
the render, generate and tokenize routes; the checkpoint routes' state), read with ``ast``
(``source.py``), inheritance flattened; the type aliases their annotations use and the
names left opaque (imported from outside vLLM, e.g. the OpenAI SDK's message params); the
engine's finish reasons and pause modes; how each route serialises its answer, each with
the source line that shows it; and the provenance: vLLM version and commit, the wheel's
file name and sha256, and each source member's sha256.

Guarantees: vLLM is never imported; the output depends only on the wheel's bytes (no
timestamps), so a re-run on the same wheel writes the same file; a class, route or
serialisation rule that is no longer where ``SOURCES`` / ``ROUTES`` / ``SERIALIZATION`` say
stops the run with a message naming it, never a silently thinner description.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from compose.engines.vllm_contract import CONTRACT_DIR, FORMAT
from compose.engines.vllm_contract.source import flatten, read_module
from compose.engines.vllm_contract.wheel import DEFAULT_CACHE, Wheel, obtain, sha256_of
from schemas.errors import TokentrailError

_CHAT = "vllm/entrypoints/openai/chat_completion/"
_TITO = "vllm/entrypoints/scale_out/token_in_token_out/"
SOURCES: dict[str, tuple[str, ...]] = {  # wheel member -> the classes read from it
    _CHAT + "protocol.py": (
        "ChatMessage", "ChatCompletionLogProb", "ChatCompletionLogProbsContent", "ChatCompletionLogProbs",
        "ChatCompletionResponseChoice", "ChatCompletionResponse", "ChatCompletionResponseStreamChoice",
        "ChatCompletionStreamResponse", "ChatCompletionToolsParam", "ChatCompletionNamedFunction",
        "ChatCompletionNamedToolChoiceParam", "ChatCompletionRequest"),
    "vllm/entrypoints/serve/engine/protocol.py": (
        "OpenAIBaseModel", "ErrorInfo", "ErrorResponse", "ModelPermission", "ModelCard", "ModelList",
        "PromptTokenUsageInfo", "CompletionTokenUsageInfo", "UsageInfo"),
    "vllm/entrypoints/generate/base/protocol.py": (
        "SpeculativeDecodingMetrics", "PerRequestMetrics", "StreamOptions", "FunctionDefinition", "FunctionCall",
        "ToolCall", "DeltaFunctionCall", "DeltaToolCall", "DeltaMessage", "JsonSchemaResponseFormat",
        "LegacyStructuralTag", "LegacyStructuralTagResponseFormat", "StructuralTagResponseFormat", "ResponseFormat"),
    "vllm/entrypoints/serve/tokenize/protocol.py": ("TokenizeChatRequest", "TokenizeResponse"),
    _TITO + "protocol.py": (
        "ParseContext", "ReasoningParserKwargs", "PlaceholderRangeInfo", "MultiModalFeatures", "GenerateRequest", "GenerateLogProb",
        "GenerateLogProbsContent", "GenerateLogProbs", "GenerateChoiceBase", "GenerateTokensChoice",
        "GenerateDerenderChoice", "GenerateResponseBase", "GenerateTokensResponse", "GenerateDerenderResponse",
        "GenerateStreamChoiceBase", "GenerateTokensStreamChoice", "GenerateDerenderStreamChoice",
        "GenerateStreamResponseBase", "GenerateTokensStreamResponse", "GenerateDerenderStreamResponse"),
    "vllm/entrypoints/serve/checkpoint/api_router.py": ("CheckpointStateResponse",),
    "vllm/v1/engine/__init__.py": ("CheckpointState",),
    "vllm/outputs.py": ("WeightVersionSpan",),
    "vllm/logprobs.py": ("Logprob",),
    "vllm/sampling_params.py": ("SamplingParams", "StructuredOutputsParams", "RepetitionDetectionParams",
                                "RequestOutputKind"),
}
ROUTES: dict[str, dict[str, Any]] = {  # "METHOD path" -> the router that declares it and its models
    "POST /v1/chat/completions": {"router": _CHAT + "api_router.py", "request": "ChatCompletionRequest",
                                  "response": "ChatCompletionResponse", "stream": "ChatCompletionStreamResponse",
                                  "error": "ErrorResponse"},
    "POST /v1/chat/completions/render": {"router": "vllm/entrypoints/scale_out/render/api_router.py",
                                         "request": "ChatCompletionRequest", "response": "GenerateRequest",
                                         "error": "ErrorResponse"},
    "POST /inference/v1/generate": {"router": _TITO + "api_router.py", "request": "GenerateRequest",
                                    "response": "GenerateTokensResponse | GenerateDerenderResponse",
                                    "stream": "GenerateTokensStreamResponse | GenerateDerenderStreamResponse",
                                    "error": "ErrorResponse"},
    "POST /tokenize": {"router": "vllm/entrypoints/serve/tokenize/api_router.py", "request": "TokenizeChatRequest",
                       "response": "TokenizeResponse", "error": "ErrorResponse"},
    "POST /checkpoint/prepare": {"router": "vllm/entrypoints/serve/checkpoint/api_router.py",
                                 "query": {"mode": "PauseMode", "default": "wait"},
                                 "response": "CheckpointStateResponse", "served_with": "--enable-sleep-mode"},
    "POST /checkpoint/restore": {"router": "vllm/entrypoints/serve/checkpoint/api_router.py",
                                 "response": "CheckpointStateResponse", "served_with": "--enable-sleep-mode"},
    "GET /checkpoint/status": {"router": "vllm/entrypoints/serve/checkpoint/api_router.py",
                               "response": "CheckpointStateResponse", "served_with": "--enable-sleep-mode"},
}
# How answers become JSON: (member, regex over its whitespace-collapsed text, the rule it shows)
SERIALIZATION: dict[str, tuple[str, str, str]] = {
    "chat_response": (_CHAT + "api_router.py", r"ChatCompletionResponse\): return JSONResponse\( content=generator\.model_dump\(\)",
                      "model_dump(): every field present, unset ones null, but for omitted_when_none fields "
                      "and serializer_drops"),
    "chat_stream_chunk": (_CHAT + "serving.py", r"model_dump_json\( exclude_unset=True, exclude_none=not chunk\.choices",
                          "model_dump_json(exclude_unset=True): only fields the server set; a chunk with no "
                          "choices (the usage chunk) also drops every null"),
    "render_response": ("vllm/entrypoints/serve/utils/api_utils.py", r"content: Any = result\.model_dump\(\)",
                        "model_dump() of the GenerateRequest"),
    "checkpoint_state": ("vllm/entrypoints/serve/checkpoint/api_router.py",
                         r"model_dump\(mode=\"json\", exclude_none=True\)", "model_dump(exclude_none=True)"),
}
ENGINE = "vllm/v1/engine/__init__.py"


class GenerateError(TokentrailError):
    """The wheel does not have what the description needs where SOURCES/ROUTES/SERIALIZATION say."""


def describe(wheel: Wheel, wheel_sha256: str) -> dict[str, Any]:
    version, commit = wheel.version()
    modules = {member: read_module(member, wheel.text(member)) for member in SOURCES}
    classes: dict[str, Any] = {}
    for member, names in SOURCES.items():
        for name in names:
            if name not in modules[member]["classes"]:
                raise GenerateError(f"{member} has no class {name} in vLLM {version}; update SOURCES in {__file__}")
            classes[name] = modules[member]["classes"][name]
    flatten(classes)
    for cls in classes.values():
        if cls["kind"] == "pydantic":
            cls.setdefault("extra", "ignore")  # pydantic's default
    aliases, opaque = _names(classes, modules)
    engine = modules[ENGINE]
    return {
        "format": FORMAT,
        "vllm": {"version": version, "commit": commit, "wheel": wheel.path.name, "sha256": wheel_sha256},
        "sources": {m: {"sha256": hashlib.sha256(wheel.text(m).encode()).hexdigest(), "classes": list(n)}
                    for m, n in SOURCES.items()},
        "routes": _routes(wheel),
        "serialization": _serialization(wheel),
        "finish_reasons": _constant(wheel.text(ENGINE), "FINISH_REASON_STRINGS"),
        "pause_modes": engine["aliases"].get("PauseMode"),
        "classes": classes,
        "aliases": aliases,
        "opaque": opaque,
    }


_KNOWN = {"int", "float", "str", "bool", "None", "Any", "object", "list", "dict", "tuple", "set", "Literal", "Annotated",
          "Optional", "Union", "SerializeAsAny", "NonNegativeInt", "JsonValue", "Sequence", "Mapping"}


def _type_names(node: ast.expr) -> list[str]:
    """The names a type expression refers to: not Literal values, not Annotated metadata, not attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.BinOp):
        return _type_names(node.left) + _type_names(node.right)
    if isinstance(node, ast.Subscript):
        base = ast.unparse(node.value).split(".")[-1]
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Literal":
            return [base]
        if base == "Annotated":
            args = args[:1]
        return [base] + [n for a in args for n in _type_names(a)]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for e in node.elts for n in _type_names(e)]
    return []


def _names(classes: dict[str, Any], modules: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The aliases the annotations use (transitively), and the names neither read nor aliased (opaque)."""
    all_aliases = {k: v for m in modules.values() for k, v in m["aliases"].items()}
    imports = {k: v for m in modules.values() for k, v in m["imports"].items()}
    aliases: dict[str, str] = {}
    opaque: dict[str, str] = {}
    todo = [f["annotation"] for c in classes.values() for f in c["fields"].values()]
    while todo:
        for name in _type_names(ast.parse(todo.pop(), mode="eval").body):
            if name in classes or name in _KNOWN or name in aliases or name in opaque:
                continue
            if name in all_aliases:
                aliases[name] = all_aliases[name]
                todo.append(all_aliases[name])
            else:
                opaque[name] = imports.get(name, "unknown")
    return dict(sorted(aliases.items())), dict(sorted(opaque.items()))


def _routes(wheel: Wheel) -> dict[str, Any]:
    out = {}
    for route, spec in ROUTES.items():
        path = route.split(" ", 1)[1]
        if f'"{path}"' not in wheel.text(spec["router"]):
            raise GenerateError(f"{spec['router']} no longer declares {route}; update ROUTES in {__file__}")
        out[route] = spec
    return out


def _serialization(wheel: Wheel) -> dict[str, Any]:
    out = {}
    for name, (member, pattern, rule) in SERIALIZATION.items():
        text = " ".join(wheel.text(member).split())
        found = re.search(pattern, text)
        if found is None:
            raise GenerateError(f"{member}: the {name} rule ({rule}) is gone (no /{pattern}/); read how the release "
                                f"serialises it and update SERIALIZATION in {__file__}")
        out[name] = {"rule": rule, "evidence": f"{member}: {found.group(0)}"}
    return out


def _constant(text: str, name: str) -> Any:
    found = re.search(rf"^{name}\s*=\s*(\([^)]*\))", text, re.M)
    if found is None:
        raise GenerateError(f"{ENGINE} has no {name}; update generate.py")
    return list(json.loads("[" + found.group(1)[1:-1].rstrip(", ").replace("'", '"') + "]"))


def write(description: dict[str, Any], out_dir: Path = CONTRACT_DIR) -> Path:
    path = out_dir / f"vllm-{description['vllm']['version']}.json"
    path.write_text(json.dumps(description, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compose.engines.vllm_contract.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", required=True, help="a vllm-*.whl path, or a version to download (0.34.0)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where downloaded wheels are kept")
    parser.add_argument("--out-dir", type=Path, default=CONTRACT_DIR, help="where vllm-<version>.json is written")
    args = parser.parse_args(argv)
    try:
        path = obtain(args.wheel, args.cache)
        with Wheel(path) as wheel:
            written = write(describe(wheel, sha256_of(path)), args.out_dir)
    except TokentrailError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {written} from {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
