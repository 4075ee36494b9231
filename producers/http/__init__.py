"""The interceptor's HTTP edge: the ASGI app (``app``), admission (``admission``), which prefix and route a
request came through (``routing``, ``route_policy``), stateless replies and forwarding (``replies``), the
control routes (``control``), reading bodies from outside (``json_limits``) and calling a wrapped ASGI app
in-process (``inprocess``, for the vLLM middleware).
"""
