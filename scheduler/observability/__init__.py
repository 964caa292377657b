"""What the scheduler shows about itself and about the cluster's cards: Prometheus metrics
(``metrics``, ``device_metrics``), the health endpoints (``health``), logs (``logs``), the
per-card account of Device CRs and annotations (``inspect``, ``inspect_gpushare``) and the
why-not of a pending pod (``explain``).

Independent of the core (``scheduler.core`` reports through the observer protocol it
declares; ``explain`` reads a scheduler through a protocol of its own): the command modules
wire the two together. Nothing here imports the ``kubernetes`` client.
"""
