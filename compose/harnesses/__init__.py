"""What drives the interceptor as a user would.

``sdk``: the OpenAI/Anthropic SDK harness of the demo and the tests; ``claude_code`` and ``codex``:
the real CLIs (pinned, from npm: ``npm``), their runners and stub servers (``stub_server``).
"""
