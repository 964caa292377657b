"""Fair-share GPU time slicing on the node: Gemini's token scheduler inside koordlet.

``protocol`` is the pure codec of Gemini's wire messages (SPEC section 11), ``tokens`` the pure
token scheduler (injected clock), ``model`` the server's records, ``loop`` its event loop,
``server`` the ADAPTER serving the protocol on TCP sockets, ``service`` its lifecycle fed by
the node's pods (decoded into clients by ``koordlet.pods.fairshare``), ``monitor`` the
measured usage per pod (process -> pod by cgroup), ``client`` a blocking client of the
protocol. Importing this package opens nothing.
"""
