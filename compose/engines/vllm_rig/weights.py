"""Push new weights into a running vLLM server (the CPU build this tier runs), so later generations use them.

What this build offers, read from its source and tried on it (``tests/integration/compose/engines/test_vllm_weight_push.py``):

* ``POST /update_weights`` (with ``/init_weight_transfer_engine``, ``/start_weight_update``,
  ``/finish_weight_update``) needs ``--weight-transfer-config``; without it every call answers 500
  "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer.".
  Every registered backend moves tensors device to device (nccl, sparse_nccl, nccl_m2n: NCCL;
  ipc: CUDA IPC handles; sharded_rdt, modelexpress: RDMA), so none can carry weights into a CPU worker.
* ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` works:
  the worker reloads every tensor in place from the safetensors in ``DIR`` (checkpoint format).
  The route passes only strings, so tensors travel through a directory the server can read.
  This is what ``push_weights`` does (``MECHANISM``).
* ``POST /update_weight_version {"new_version": L}`` sets the label ``GET /weight_info`` reports
  (``{"weight_version": "default"}`` at start); it changes no weights.
* ``POST /pause?mode=abort|wait|keep`` / ``POST /resume`` / ``GET /is_paused``: abort ends in-flight
  requests, wait lets them finish (the call returns once drained), keep freezes them; requests that
  arrive while paused queue and run after ``/resume`` (per the source). abort and wait also clear
  the prefix cache; keep does not.

Every route here exists only when the server runs with ``VLLM_SERVER_DEV_MODE=1``; the engine must
see the same filesystem as the caller (same host or a shared volume).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from compose.engines.vllm_rig.admin import PauseMode, WeightPushError, call, pause, resume, set_version

__all__ = ["MECHANISM", "push_weights", "read_safetensors", "write_safetensors"]

MECHANISM = "collective_rpc:reload_weights"
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


def write_safetensors(path: Path, tensors: Mapping[str, Any]) -> None:
    """Write ``tensors`` (numpy arrays, or anything ``np.asarray`` takes) as one safetensors file, names sorted."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    arrays, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(np.asarray(tensors[name]))
        if a.dtype not in _CODES:
            raise WeightPushError(f"tensor {name!r} has dtype {a.dtype}, which this writer does not encode; "
                                  f"convert it to one of {sorted(str(np.dtype(d)) for d in _DTYPES.values())}")
        header[name] = {"dtype": _CODES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        arrays.append(a)
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for a in arrays:
            f.write(a.tobytes())


def _header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor in one safetensors file, as writable numpy arrays."""
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    body = memoryview(data)[8 + n:]
    return {name: np.frombuffer(body[s:e], dtype=_DTYPES[h["dtype"]]).reshape(h["shape"]).copy()
            for name, h in _header(Path(path)).items() for s, e in [h["data_offsets"]]}


def _shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    return {name: tuple(h["shape"]) for f in sorted(directory.glob("*.safetensors")) for name, h in _header(f).items()}


def _check_complete(url: str, directory: Path) -> None:
    """Refuse, before the engine is touched, a set that is not the served checkpoint's names and shapes.

    Why: a reload that fails part-way leaves layers half-replaced, and the next forward pass can
    kill the worker (seen on this build: a refused /update_weights, then a segfault on the next
    request). Skipped when the served model is not a local directory (a hub id, another host).
    """
    served = Path(str(call("GET", url, "/v1/models")["data"][0].get("root") or ""))
    if not served.is_dir() or not any(served.glob("*.safetensors")):
        return
    want, got = _shapes(served), _shapes(directory)
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    wrong = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    if missing or extra or wrong:
        raise WeightPushError(
            f"weights do not match the served checkpoint {served}: missing {missing[:5]}, unknown {extra[:5]}, "
            f"wrong shape {[(k, got[k], want[k]) for k in wrong[:5]]}; push every tensor, with the served "
            "names and shapes (nothing was sent)")


def _reload(url: str, directory: Path, timeout: float) -> None:
    call("POST", url, "/collective_rpc", timeout=timeout,
          json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}, "timeout": timeout})


def push_weights(engine_url: str, weights: Path | str | Mapping[str, Any], version_label: str, *,
                 pause_mode: PauseMode = "wait", timeout: float = 300.0,
                 announce: Callable[[str], None] | None = None) -> str:
    """Replace every weight of the running engine and label the new version; returns ``MECHANISM``.

    ``weights`` is a checkpoint directory holding ``*.safetensors`` (HF names, as the engine loaded
    them), or a complete name -> array mapping, written to a temporary directory for the engine to
    read. A set that does not carry exactly the served checkpoint's names and shapes is refused
    before the engine is touched. Steps: pause (``pause_mode``), reload in place, drop the prefix
    cache (KV of frozen requests too, so they recompute under the new weights), set the label,
    resume; ``announce(label)`` (the versions topic, the interceptor's admin route) runs after the label is
    set and before the resume: it must return only once the interceptors applied the label
    (``schemas.kafka.announce.announce_version`` waits for every live one to confirm, the admin
    route answers once applied), and if it raises the engine is left paused, so no token of the
    new weights can be labelled with the old version. With the default ``wait`` every request is generated by exactly one weight version;
    with ``keep`` a request in flight continues under the new weights.

    Raises ``WeightPushError`` naming the route and the engine's answer. If the reload itself is
    refused the engine is left paused (it may hold part of the new set): push a complete set
    again, or ``resume`` to serve what it holds.
    """
    if not isinstance(version_label, str) or not version_label:
        raise WeightPushError(f"version_label must be a non-empty string, got {version_label!r}")
    if isinstance(weights, Mapping):
        if not weights:
            raise WeightPushError("weights is an empty mapping; pass every tensor of the model")
        with tempfile.TemporaryDirectory(prefix="tokentrail-weights-") as tmp:
            write_safetensors(Path(tmp) / "model.safetensors", weights)
            return push_weights(engine_url, Path(tmp), version_label, pause_mode=pause_mode, timeout=timeout,
                                announce=announce)
    directory = Path(weights).resolve()
    if not directory.is_dir() or not any(directory.glob("*.safetensors")):
        raise WeightPushError(f"weights={str(weights)!r} is not a directory holding *.safetensors; pass a "
                              "checkpoint directory or a name -> array mapping")
    _check_complete(engine_url, directory)
    pause(engine_url, pause_mode, timeout=timeout)
    _reload(engine_url, directory, timeout)
    if not call("POST", engine_url, "/reset_prefix_cache", params={"reset_running_requests": "true"})["success"]:
        raise WeightPushError(f"POST /reset_prefix_cache on {engine_url} answered success=false after the reload; "
                              "the engine is left paused so no request reuses KV of the old weights")
    set_version(engine_url, version_label)
    if announce is not None:
        # Before the resume: an interceptor that splits streams where the version changed
        # (producers.capture.version_clock) must know the new version before any token of it exists;
        # announce_version returns only once every live interceptor confirmed it applied it.
        announce(version_label)
    resume(engine_url)
    return MECHANISM
