"""The composition roots of the scheduler's front ends, one module per command: the only
scheduler modules that build adapters (``scheduler.kube``, the in-memory cluster, the
servers) and wire them to the core. ``scheduler.cli`` parses and dispatches to them.

``run`` (and ``extender``, which composes the same way), ``simulate``, ``inspect``,
``explain`` and the ``kubectl-inspect-gpushare`` plugin. The Kubernetes adapter is imported
inside the commands that need it, so ``simulate`` starts fast and works without it.
"""
