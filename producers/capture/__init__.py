"""The evidence of a call: the capture core (``core``: one call from request to durable record), its
contract events (``events``), request-time lineage (``lineage_index``), identity signals (``trace_facts``),
the announced policy version (``version_clock``), and durability (``durable``, ``publisher``, ``spool``:
Kafka's ack, or an fsynced spool).
"""
