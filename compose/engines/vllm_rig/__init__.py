"""The real vLLM engine in the rig: its CPU build on a tiny checkpoint built here (``checkpoint``), the launcher (``engine``), pushing weights into a running engine (``weights``)."""
