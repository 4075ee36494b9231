"""``python -m compose.harnesses.claude_code install | record-fixtures DIR``."""

from compose.harnesses.claude_code.fixtures import main

raise SystemExit(main())
