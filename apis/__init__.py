"""Pure wire types and codecs shared by the scheduler, the node agent and the runtime hooks.

Standard library only, no I/O, nothing happens at import time.  Every wire format of the
SPEC that components exchange lives here: Kubernetes quantities (``quantity``), device
resource names and request rules (``resources``), the Device CR (``device``), the
``device-allocated`` annotation (``allocation``), the hint annotations (``hints``) and the
kubelet device checkpoint (``checkpoint``).
"""
