"""``tokentrail versions``: the trainer's announcements of policy versions.

``announce LABEL --step N`` publishes the version on the compacted policy-versions topic
(``schemas.kafka.announce.announce_version``), after forwarding the label to the engine's
``/update_weight_version`` when ``--engine`` is given (vLLM dev mode), so the engine's own
spans and tokentrail's agree, and then waits until every live interceptor reported it applied
the version (``wait_applied``; ``--confirm-timeout``, ``--min-followers``; ``--no-confirm``
skips it): resume the engine only after it returned. ``show`` prints every announced label with
its step, the current one marked. Exit 0 done, 2 invalid arguments, 3 the broker or the engine
refused, or interceptors did not confirm (each named).

Every invalid input is one line naming the field, the value and the fix, exit 2, before any
I/O (``schemas.policy_versions.announcement_problem``): a label is printable text of at most
256 characters, ``default`` is step 0 only, 0 <= step < 2**63; and a label already on the topic
with another step is refused (exit 2): steps order versions, so a label's step never changes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import urllib.parse

from schemas.kafka.security import KafkaSecurity, add_kafka_config_option
from schemas.kafka.topics import add_topic_options

EXIT_INVALID, EXIT_TRANSPORT = 2, 3


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    announce = sub.add_parser("announce", help="publish a new current policy version")
    announce.add_argument("label", help="the version label (as the engine reports it)")
    announce.add_argument("--step", type=int, required=True, help="the trainer's update count (orders versions)")
    announce.add_argument("--weights", default="", help="how the weights reached the engine (free text)")
    announce.add_argument("--engine", help="first POST the label to this vLLM server's /update_weight_version "
                                           "(served with VLLM_SERVER_DEV_MODE=1)")
    announce.add_argument("--engine-api-key", default=os.environ.get("VLLM_API_KEY"),
                          help="bearer token of the engine (default: $VLLM_API_KEY)")
    announce.add_argument("--confirm-timeout", type=float, default=30.0, metavar="S",
                          help="wait this long for every live interceptor to confirm it applied the version "
                               "(exit 3 naming those that did not; default 30)")
    announce.add_argument("--min-followers", type=int, default=0, metavar="N",
                          help="also require at least N interceptors to confirm (default 0)")
    announce.add_argument("--no-confirm", action="store_true",
                          help="return once the broker acknowledged, without waiting for interceptors (tokens "
                               "sampled before they applied it may carry the old version)")
    show = sub.add_parser("show", help="print the announced versions")
    show.add_argument("--json", action="store_true", help="one JSON object per label")
    for sp in (announce, show):
        sp.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers host:port")
        add_topic_options(sp, wait=False)
        add_kafka_config_option(sp)


def main(args: argparse.Namespace) -> int:
    from schemas.errors import ConfigError, ContractError, TransportError
    from schemas.kafka.security import security_of_args
    from schemas.kafka.topics import check_bootstrap, topic_names
    from schemas.policy_versions import PolicyVersion, announcement_problem

    topic = topic_names(args.topic_prefix).policy_versions
    try:
        check_bootstrap(args.bootstrap)
        args.security = security_of_args(args)  # parsed once, before any I/O
        if args.action == "announce":
            problem = announcement_problem(args.label, args.step, args.weights)
            if problem is not None:
                raise ValueError(problem)
            PolicyVersion(label=args.label, step=args.step)  # validated before any I/O
            _check_engine(args.engine)
            if not args.confirm_timeout > 0:
                raise ValueError(f"--confirm-timeout={args.confirm_timeout}: must be > 0 seconds "
                                 "(--no-confirm to not wait)")
            if args.min_followers < 0:
                raise ValueError(f"--min-followers={args.min_followers}: must be >= 0")
    except (ValueError, ContractError, ConfigError) as exc:
        print(f"tokentrail versions: invalid arguments: {exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        if args.action == "announce":
            return _announce(args, topic)
        return _show(args, topic)
    except TransportError as exc:
        print(f"tokentrail versions: {exc}", file=sys.stderr)
        return EXIT_TRANSPORT


def _announce(args: argparse.Namespace, topic: str) -> int:
    from compose.engines.vllm_rig.admin import set_version
    from schemas.kafka.announce import announce_version, wait_applied

    earlier = announced_steps(args.bootstrap, topic, args.security).get(args.label)
    if earlier is not None and earlier != args.step:
        print(f"tokentrail versions: invalid arguments: label={args.label!r} was announced at step {earlier}, not "
              f"step={args.step}: a label's step never changes (steps order versions); announce the new weights "
              f"under a new label, or repeat --step {earlier}", file=sys.stderr)
        return EXIT_INVALID
    if args.engine:  # the engine first: the topic never names a version the engine refused
        set_version(args.engine, args.label, api_key=args.engine_api_key)
    announcement = announce_version(args.bootstrap, args.label, args.step, topic=topic, weights=args.weights,
                                    confirm=False, security=args.security)
    confirmed = None
    if not args.no_confirm:  # every live interceptor applied it: the engine may resume
        confirmed = wait_applied(args.bootstrap, args.label, args.step, topic=topic, timeout_s=args.confirm_timeout,
                                 min_followers=args.min_followers, security=args.security)
    print(json.dumps({"label": announcement.label, "step": announcement.step, "topic": topic,
                      "engine": args.engine or None, "confirmed_by": confirmed}))
    return 0


def announced_steps(bootstrap: str, topic: str, security: KafkaSecurity | None = None) -> dict[str, int]:
    """Every label on the topic with its step (read to its end); TransportError when it cannot be read."""
    from schemas.errors import TransportError
    from schemas.kafka.versions import VersionFollower

    follower = VersionFollower(bootstrap, topic, security=security).start()
    try:
        if not follower.wait_caught_up(30):
            raise TransportError(f"{topic} not read to its end within 30 s (checking the label's earlier step)")
        return dict(follower.book.steps())
    finally:
        follower.close()


def _check_engine(url: str | None) -> None:
    parts = urllib.parse.urlsplit(url or "")
    if url is not None and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise ValueError(f"--engine={url!r}: must be the engine's base URL, http(s)://host:port")


def _show(args: argparse.Namespace, topic: str) -> int:
    from schemas.kafka.versions import VersionFollower

    follower = VersionFollower(args.bootstrap, topic, security=args.security).start()
    try:
        if not follower.wait_caught_up(30):
            print(f"tokentrail versions: {topic} not read to its end within 30 s", file=sys.stderr)
            return EXIT_TRANSPORT
        book = follower.book
    finally:
        follower.close()
    current = book.current_label
    for label, step in sorted(book.steps().items(), key=lambda kv: (kv[1], kv[0])):
        if args.json:
            print(json.dumps({"label": label, "step": step, "current": label == current}))
        else:
            print(f"{'*' if label == current else ' '} {step:>8}  {label}")
    if not args.json and current is None:
        print(f"(no version announced on {topic})")
    if not args.json and book.current is not None:  # the current label's version
        at = datetime.datetime.fromtimestamp(book.current.announced_at, datetime.UTC).isoformat()
        print(f"current: {current} (step {book.current.step}, announced {at})")
    return 0
