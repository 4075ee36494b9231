"""The engine side, without the HTTP edge: what it serves (``info``), the
exact tokens read out of its answers (``extract``, ``chat_stream``), the exact prefix a continuing call is
given (``prefix_supply``) and a generation continued across an abort (``continuation``).
"""
