"""Replay and diagnosis: read a rollout back from the event log, fold and rebuild it, explain or summarise the masks."""
