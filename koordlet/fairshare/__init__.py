"""Fair-share GPU time slicing on the node: Gemini's token scheduler inside koordlet.

``protocol`` is the pure codec of Gemini's wire messages (SPEC section 11), ``tokens`` the pure
token scheduler (injected clock), ``pods`` the pure pod -> client-share decoding, ``cgroups``
the process -> pod mapping, ``server`` the ADAPTER serving the protocol on TCP sockets.
Importing this package opens nothing.
"""
