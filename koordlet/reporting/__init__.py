"""Reporting the node to the API server: its Device CR, labels and extended resources.

``reporter`` (pure) decides what the node should look like, ``partitions`` (pure) derives
the GPU partition table it publishes, and ``sync`` owns the ``NodeAPI`` port and the loop
that writes the difference. The ``koordlet.kube`` adapter implements the port.
"""
