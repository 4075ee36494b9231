"""``python -m compose.codex install``."""

from compose.codex.install import main

raise SystemExit(main())
