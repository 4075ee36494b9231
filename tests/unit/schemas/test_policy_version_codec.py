"""The policy-versions topic's record: pinned bytes (other processes and releases read them), exact round trips."""

from __future__ import annotations

import pytest

from schemas.archive import TOP_LEVEL
from schemas.codec import policy_version_codec
from schemas.errors import CodecError, ContractError
from schemas.policy_versions import PolicyVersion

GOLDEN = PolicyVersion(label="step-7", step=7, announced_at=1767225600.5, weights="collective_rpc:reload_weights")
# Never regenerate silently: a change here means every follower of a live topic must be upgraded first.
GOLDEN_HEX = ("c301f5ebe2b8642e2d9f0c737465702d370e000020406e55da413a636f6c6c6563746976655f7270633a72656c6f61"
              "645f77656967687473")


def test_the_golden_announcement_encodes_to_the_pinned_bytes_and_back():
    codec = policy_version_codec()
    assert codec.encode(GOLDEN).hex() == GOLDEN_HEX
    assert codec.decode(bytes.fromhex(GOLDEN_HEX)) == GOLDEN


def test_the_header_is_the_archived_schema_fingerprint():
    assert "PolicyVersion" in TOP_LEVEL
    assert policy_version_codec().fingerprint.hex() == "f5ebe2b8642e2d9f"  # schemas/avro/history/PolicyVersion.*


@pytest.mark.parametrize("announcement", [
    PolicyVersion(label="default", step=0),
    PolicyVersion(label="ckpt/ünïcode-🙂", step=2**62, announced_at=-0.0, weights=""),
    PolicyVersion(label="x" * 256, step=1, announced_at=1e-300, weights="w" * 10_000),
])
def test_announcements_round_trip_exactly(announcement):
    codec = policy_version_codec()
    back = codec.decode(codec.encode(announcement))
    assert back == announcement and repr(back.announced_at) == repr(announcement.announced_at)


def test_a_record_that_is_not_an_announcement_is_refused_not_guessed():
    codec = policy_version_codec()
    with pytest.raises(CodecError):
        codec.decode(b"\x00garbage")
    with pytest.raises(CodecError):
        codec.decode(bytes.fromhex(GOLDEN_HEX) + b"\x00")
    # The label-step contract holds on the way in too: a writer that bypassed it is refused.
    bad = bytes.fromhex(GOLDEN_HEX.replace("0e000020", "05000020"))  # step zigzag 0x05 = -3
    with pytest.raises(ContractError, match="step=-3"):
        codec.decode(bad)
