"""``python -m compose.harnesses.codex install``."""

from compose.harnesses.codex.install import main

raise SystemExit(main())
