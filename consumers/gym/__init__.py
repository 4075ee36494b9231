"""NeMo Gym interop: ``TokenSink``, ``TokenSource`` and ``TokenLineage`` over tokentrail's topics, and their conformance kit."""

from schemas.surface import lazy_surface

__all__, __getattr__ = lazy_surface(__name__, {
    "TokenSink": "consumers.gym.adapters",
    "TokenSource": "consumers.gym.adapters",
    "TokenLineage": "consumers.gym.adapters",
    "entry_to_call": "consumers.gym.adapters",
    "call_to_entry": "consumers.gym.adapters",
    "run_gym_conformance": "consumers.gym.conformance",
    "GymConformanceError": "consumers.gym.conformance",
})
