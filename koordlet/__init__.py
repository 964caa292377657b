"""koordlet: the node agent (SPEC sections 2, 4, 8).

It discovers the node's GPUs (``devices``: NVML, or a YAML description for nodes without
it), watches their health, reads the kubelet device checkpoint (``checkpoint``), turns all of
that into the node's Device CR and extended resources (``reporter``, pure), writes them to the
API server (``sync`` + the ``kube`` adapter) and serves Prometheus metrics (``metrics``).
``cli`` is the composition root and the only place where adapters are built.

Importing any module of this package starts, opens or registers nothing.
"""
