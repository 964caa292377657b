"""koordlet: the node agent (SPEC sections 2, 4, 8).

It discovers the node's GPUs (``devices``: NVML, or a YAML description for nodes without
it), watches their health, reads what the kubelet handed out (``kubelet``: the device
checkpoint), turns all of that into the node's Device CR and extended resources and writes
them to the API server (``reporting``, through the ``kube`` adapter), decodes the node's pods
once (``pods``), admits and hooks containers (``admission``, ``hookserver``), runs fair share
(``fairshare``) and gpushare's device plugin (``deviceplugin``), and serves Prometheus
metrics (``metrics``). ``agent`` runs the services, ``cli`` is the composition root and the
only place where adapters are built. See docs/architecture.md.

Importing any module of this package starts, opens or registers nothing.
"""
