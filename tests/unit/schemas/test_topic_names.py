"""Topic names: one table of every topic, prefixed as a unit, and every one of them configured."""

from __future__ import annotations

from compose.topics import topic_configs
from schemas.topics import POLICY_VERSIONS, REBUILT_GROUPS, ROLLOUT_EVENTS, TopicNames, topic_names, topic_prefix


def test_a_prefix_reaches_every_topic_and_is_recovered():
    names = topic_names("t1.")
    assert all(name.startswith("t1.tokentrail.") for name in names.all())
    assert names.all() == tuple("t1." + name for name in TopicNames().all())
    assert topic_prefix(names) == "t1."


def test_every_topic_is_listed_once_including_the_later_ones():
    everything = TopicNames().all()
    assert len(set(everything)) == len(everything)
    assert {ROLLOUT_EVENTS, POLICY_VERSIONS, REBUILT_GROUPS} <= set(everything)


def test_every_topic_gets_a_config_so_tokentrail_topics_creates_it():
    names = topic_names("t2.")
    assert set(topic_configs(names)) == set(names.all())


def test_names_not_made_by_topic_names_have_no_prefix():
    assert topic_prefix(TopicNames(rebuilt="elsewhere")) is None
