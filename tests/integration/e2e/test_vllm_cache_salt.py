"""No KV cache across policy versions, on real vLLM: the prefix cache serves a prompt again within a
version, and not once the interceptor follows a new one (``producers.capture.call_versions.cache_salt``; vLLM's prefix-cache
keys do not include the weights, its docs recommend a salt per weight version)."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from compose.rig.stack import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.real_broker, pytest.mark.vllm]

# A prompt of several KV blocks, the same each time (vLLM caches whole blocks only).
PROMPT = " ".join(f"token{i % 61}" for i in range(900))
_HITS = re.compile(r'^vllm:prefix_cache_hits_total(?:\{[^}]*\})? ([0-9.e+]+)$', re.M)


def _hits(engine_url: str) -> float:
    """Prompt tokens the engine served from its prefix cache so far (summed over its engines)."""
    text = httpx.get(f"{engine_url}/metrics", timeout=30).text
    found = _HITS.findall(text)
    assert found, "vLLM's /metrics has no vllm:prefix_cache_hits_total"
    return sum(float(v) for v in found)


def _call(stack: LocalStack, rid: str) -> None:
    r = httpx.post(f"{stack.capture_base_url(rid)}/chat/completions", timeout=120,
                   json={"model": "policy", "max_tokens": 1, "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200, r.text


def test_the_prefix_cache_hits_within_a_version_and_never_across(kafka_bootstrap, tmp_path_factory,
                                                                vllm_random_engine):
    tag = uuid.uuid4().hex[:8]
    with LocalStack(kafka_bootstrap, tmp_path_factory.mktemp("salt"), topic_prefix=f"cs{tag}.",
                    processor_id=f"cs{tag}", upstream_url=vllm_random_engine.url, with_pipeline=False) as stack:
        admin = {"authorization": f"Bearer {stack.control_token}"}

        def announce(label: str) -> None:
            r = httpx.post(f"{stack.interceptor_url}/tokentrail/admin/policy-version", json={"version": label},
                           headers=admin, timeout=30)
            assert r.status_code == 200, r.text

        announce(f"salt-a-{tag}")
        _call(stack, f"s1-{tag}")  # computes (or finds nothing for) this version's prefix
        before = _hits(vllm_random_engine.url)
        _call(stack, f"s2-{tag}")
        within = _hits(vllm_random_engine.url) - before
        assert within >= 256, f"the same prompt under the same version hit {within} cached tokens"
        announce(f"salt-b-{tag}")
        before = _hits(vllm_random_engine.url)
        _call(stack, f"s3-{tag}")
        across = _hits(vllm_random_engine.url) - before
        assert across == 0, f"after a version change the prompt reused {across} tokens of the old version's KV"
        _call(stack, f"s4-{tag}")
        assert _hits(vllm_random_engine.url) - before >= 256, "the new version's own prefix is cached again"
