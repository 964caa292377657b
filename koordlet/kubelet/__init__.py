"""What the kubelet tells the node agent about devices it handed out.

``checkpoint`` reads the kubelet's device-plugin checkpoint file, ``watch`` wakes the agent
when the kubelet rewrites it (inotify), ``devices`` holds the GPUs the runtime hook saw the
kubelet hand out before the checkpoint lists them, ``grants`` tells the runtime hook which GPUs
the kubelet gave one container, and ``deviceids`` (pure) turns device-plugin ids into the card
they live on. Nothing here talks to the API server.
"""
