"""NeMo Gym interop: ``TokenSink``, ``TokenSource`` and ``TokenLineage`` over tokentrail's topics, and their conformance kit."""
