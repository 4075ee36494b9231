"""Topic names: one table of every topic, prefixed as a unit, and every one of them configured."""

from __future__ import annotations

from dataclasses import fields

from schemas.kafka.topics import (
    POLICY_VERSIONS,
    REBUILT_GROUPS,
    ROLLOUT_EVENTS,
    TOPICS,
    TopicNames,
    partitions_of,
    topic_names,
    topic_prefix,
)


def test_a_prefix_reaches_every_topic_and_is_recovered():
    names = topic_names("t1.")
    assert all(name.startswith("t1.tokentrail.") for name in names.all())
    assert names.all() == tuple("t1." + name for name in TopicNames().all())
    assert topic_prefix(names) == "t1."


def test_every_topic_is_listed_once_including_the_later_ones():
    everything = TopicNames().all()
    assert len(set(everything)) == len(everything)
    assert {ROLLOUT_EVENTS, POLICY_VERSIONS, REBUILT_GROUPS} <= set(everything)


def test_every_topic_is_one_row_of_the_table_with_its_config():
    assert [f.name for f in fields(TopicNames)] == [spec.field for spec in TOPICS]
    names = topic_names("t2.")
    specs = names.specs()
    assert list(specs) == list(names.all())
    assert specs[names.rollout_events].config["retention.ms"] == str(7 * 24 * 3600 * 1000)
    assert specs[names.policy_versions].config == {"cleanup.policy": "compact"}
    assert partitions_of(specs[names.policy_versions], 8) == 1 and partitions_of(specs[names.snapshots], 8) == 8


def test_names_not_made_by_topic_names_have_no_prefix():
    assert topic_prefix(TopicNames(rebuilt="elsewhere")) is None
