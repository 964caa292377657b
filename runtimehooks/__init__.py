"""The node agent's runtime-hook server (koord-runtime-proxy's hook API, SPEC section 7).

Layers, top to bottom: ``server`` (ADAPTER: grpc, unix socket, registration file) ->
``protocol`` (protobuf <-> contexts) -> ``hooks`` (pure hooks, ``new_default_registry``) ->
``registry`` (stage -> hooks, failure policy, timing) -> ``context`` (plain records,
``HookInputError``) -> ``apis``.  ``api/`` holds the .proto and its generated modules; only
``protocol`` and ``server`` import them, and only ``server`` (and ``api/``) imports grpc.

Invariants: importing any of these modules starts, binds or registers nothing.
"""
