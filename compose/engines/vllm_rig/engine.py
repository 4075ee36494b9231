"""Run the real vLLM engine (its CPU build, from ``.venv-vllm``) on a tiny checkpoint, as a child process.

``VllmEngine`` builds the checkpoint once per builder version (cached under
``.tokentrail/checkpoints/<digest>/<variant>``), starts
``python -m vllm.entrypoints.openai.api_server`` with the flags tokentrail needs
(``ENGINE_FLAGS``: ``serve.yaml``, the flags every deployment uses, with the tier's
served name, float32 and raw log-probs), waits until ``/health`` answers, and on ``stop()`` kills the whole
process group (API server, engine core, worker). Nothing outlives a run.

The engine environment is separate from tokentrail's (as an engine has its own
container): ``make vllm`` builds it; ``TOKENTRAIL_VLLM_PYTHON`` points elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from compose import REPO_ROOT as ROOT
from compose.procs.service import pick_free_ports
from schemas.errors import TokentrailError

SERVED_NAME = "tokentrail-tiny"
SERVE_CONFIG = Path(__file__).resolve().parent / "serve.yaml"  # the flags tokentrail needs, as deployed
ENGINE_FLAGS = (
    "--config", str(SERVE_CONFIG), "--served-model-name", SERVED_NAME, "--dtype", "float32",
    # Re-scoring (prompt_logprobs) is pre-temperature, so the tier samples raw log-probs: bit-equal
    # to the re-score whatever temperature a harness sends.
    "--logprobs-mode", "raw_logprobs",
)


class EngineUnavailable(TokentrailError, RuntimeError):
    """The vLLM environment is missing or the engine did not come up; the message says which and how to fix it."""


def vllm_python() -> Path:
    return Path(os.environ.get("TOKENTRAIL_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


def unavailable_reason() -> str | None:
    """None when the engine environment is installed, else why not (for skip messages)."""
    py = vllm_python()
    if not py.exists():
        return f"no vLLM engine environment at {py}: run `make vllm` (or set TOKENTRAIL_VLLM_PYTHON)"
    return None


def checkpoint(variant: str, cache: Path | None = None) -> Path:
    """The checkpoint directory for ``variant`` ("crafted" or "random"), built on first use."""
    reason = unavailable_reason()
    if reason:
        raise EngineUnavailable(reason)
    digest = subprocess.run([str(vllm_python()), "-c", "from compose.engines.vllm_rig.checkpoint import source_digest;"
                             "print(source_digest())"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    out = (cache or ROOT / ".tokentrail" / "checkpoints") / digest / variant
    out.parent.mkdir(parents=True, exist_ok=True)
    # Engines start from several threads (the pre-warmed session engines) and several processes
    # (make -j): one builder per checkpoint, the others wait for it and reuse what it built.
    with open(out.with_name(f"{variant}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "manifest.json").exists():
            tmp = out.with_name(f"{variant}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            built = subprocess.run([str(vllm_python()), "-m", "compose.engines.vllm_rig.checkpoint", str(tmp), variant],
                                   cwd=ROOT, capture_output=True, text=True)
            if built.returncode:
                raise EngineUnavailable(f"building the {variant!r} checkpoint failed (exit {built.returncode}):\n"
                                        f"{built.stderr[-4000:]}")
            tmp.rename(out)
    return out


@dataclass
class VllmEngine:
    """One vLLM API server on loopback. ``url`` is its base URL once started.

    ``nice``: the engine's processes run at this niceness (10 by default). On a 2-core machine
    the engine's compute thread holds one core and its API server and scheduler want the other;
    the Kafka broker, the interceptor, the processor and the consumer beside it must not starve
    (a broker starved for 24 s stops answering and the services give up at startup), so they
    win a contended core and the engine takes what is left.
    """

    run_dir: Path
    variant: str = "crafted"
    max_model_len: int = 32768
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 300.0
    nice: int = 10
    url: str = ""
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.run_dir / f"vllm-{self.variant}.log"

    def start(self) -> VllmEngine:
        model = checkpoint(self.variant)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (port,) = pick_free_ports(1)
        # nice(1) execs the server in place (same pid, same process group); its children inherit the niceness.
        argv = [*(["nice", "-n", str(self.nice)] if self.nice else []),
                str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(self.max_model_len),
                *ENGINE_FLAGS, *self.extra_args]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(ROOT), **self.env}
        with open(self.log, "wb") as handle:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineUnavailable(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise EngineUnavailable(f"vLLM did not answer /health within {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> VllmEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def score_prompt(url: str, token_ids: list[int]) -> list[float]:
    """log p(t_i | t_<i) for i = 1..n-1 from vLLM's ``prompt_logprobs`` (one forward pass over the ids).

    On this build the values are bit-equal to the log-probs sampled for the same ids.
    """
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    r = httpx.post(f"{url}/v1/completions", timeout=300,
                   json={"model": model, "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 0})
    r.raise_for_status()
    entries = r.json()["choices"][0]["prompt_logprobs"]  # first entry null; then {str(id): {logprob, ...}}
    return [entry[str(token)]["logprob"] for entry, token in zip(entries[1:], token_ids[1:], strict=True)]
