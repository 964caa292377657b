"""The Kubernetes adapter: the scheduler on a real API server.

The only scheduler package that talks to Kubernetes (and, in ``rest``, the only importer of
the ``kubernetes`` client, for its kubeconfig and in-cluster loaders). Modules, bottom up:

- ``ratelimit``: the client-side token bucket (QPS/burst) and the list/watch backoff;
- ``rest``: credentials, the pooled HTTPS transport, JSON requests and watch streams;
- ``informer``: list + watch of one resource into decoded records, relist on 410/errors;
- ``events``: aggregated, rate-limited core/v1 Events;
- ``leader``: Lease-based leader election;
- ``cluster``: ``KubeCluster``, the Cluster port (informers in, binds/events/conditions out).

Importing this package starts, opens or registers nothing; ``cli.py`` builds and starts it.
"""
