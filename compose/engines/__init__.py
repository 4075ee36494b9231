"""What serves the interceptor: ``policy``, the vLLM-compatible reference server (the fast stand-in),
and ``vllm_rig``, the real vLLM engine (its CPU build): checkpoint, launcher, pushing weights.
"""
