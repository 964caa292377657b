"""kube-scheduler's extender protocol served from koord-py's core (``koord-scheduler extender``)."""
