"""``python -m compose.claude_code install | record-fixtures DIR``."""

from compose.claude_code.fixtures import main

raise SystemExit(main())
