"""The node's pods, decoded once: the one pod record every node service reads.

``record`` holds ``PodRecord`` and its decoder from the v1 Pod JSON, ``cache`` the runtime
hook's uid -> record cache (filled by the sync loop's pod list, one bounded GET on a miss),
and ``fairshare`` (pure) the opted-in fair-share clients among the node's records.
"""
