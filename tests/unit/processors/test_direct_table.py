"""DirectChangelogTable.write/reader on a real RocksDB store: the same local bytes and changelog records as
Faust's own ``table[key] = value`` / ``del table[key]`` path, in one batch per event."""

from __future__ import annotations

import pytest

from processors.app import create_app
from processors.settings import ProcessorSettings


@pytest.fixture
def table(tmp_path):
    app = create_app(ProcessorSettings(bootstrap="localhost:1", data_dir=tmp_path, app_id="unit-direct"))
    app.finalize()
    return app.tokentrail_table


def test_writes_land_in_the_partition_db_with_their_changelog_records_in_order(table):
    first = table.write(1, {b"c\x00r\x00a": b"body", b"s\x00r\x00\x00": b"a", b"h\x00r": b"header"})
    assert first == [(1, b"c\x00r\x00a", b"body"), (1, b"s\x00r\x00\x00", b"a"), (1, b"h\x00r", b"header")]
    reader = table.reader(1)
    assert reader.get(b"h\x00r") == b"header" and reader.get(b"missing") is None
    assert table[b"c\x00r\x00a"] == b"body", "Faust's own read path sees the same bytes"
    assert table.reader(0).get(b"h\x00r") is None, "another partition's DB is untouched"
    # A delete of a present key is a tombstone; of an absent key, nothing (as `if key in table: del table[key]`).
    second = table.write(1, {b"h\x00r": b"tomb", b"c\x00r\x00a": None, b"c\x00r\x00never": None})
    assert second == [(1, b"h\x00r", b"tomb"), (1, b"c\x00r\x00a", None)]
    assert reader.get(b"c\x00r\x00a") is None and reader.get(b"h\x00r") == b"tomb"
    assert table.write(1, {}) == [] and table.take_changelog() == [], "nothing goes through on_key_set"


def test_a_key_that_is_not_bytes_is_refused(table):
    with pytest.raises(TypeError, match="raw bytes keys"):
        table.write(0, {"h\x00r": b"x"})
    assert table.reader(0).get(b"h\x00r") is None, "nothing of the refused event was written"
