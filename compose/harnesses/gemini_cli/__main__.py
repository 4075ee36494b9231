"""``python -m compose.harnesses.gemini_cli install | record-fixtures DIR``."""

from compose.harnesses.gemini_cli.fixtures import main

raise SystemExit(main())
