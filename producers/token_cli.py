"""``tokentrail token <rollout-id>``: print the rollout token a harness presents as its API key.

The secret is read from ``--secret-file`` or ``TOKENTRAIL_ROLLOUT_SECRET``, never from argv
(argv is visible to every user of the machine). The token is
``schemas.rollout_tokens.rollout_token(secret, rollout_id)``, the same function the
interceptor checks against; give it to the harness as its API key (``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY``, Codex's ``env_key``), e.g.
``ANTHROPIC_API_KEY=$(tokentrail token r-17) claude -p ...``.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rollout_id", help="the rollout id the harness uses in /ng-rollout/<rollout-id>/...")
    parser.add_argument("--secret-file", help="file holding the rollout secret (default: env TOKENTRAIL_ROLLOUT_SECRET)")


def main(args: argparse.Namespace) -> int:
    from producers.cli import rollout_secret_from
    from schemas.errors import TokentrailError
    from schemas.rollout_tokens import rollout_token

    try:
        secret = rollout_secret_from(os.environ, args.secret_file)
        if secret is None:
            raise ValueError("no rollout secret: set TOKENTRAIL_ROLLOUT_SECRET (as the interceptor's) or pass "
                             "--secret-file")
        print(rollout_token(secret, args.rollout_id))
    except (ValueError, TokentrailError) as exc:
        print(f"tokentrail token: {exc}", file=sys.stderr)
        return 2
    return 0
