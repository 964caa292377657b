"""Device discovery and health: the ``DeviceLibrary`` port and its implementations.

``library`` holds the port and its records, ``nvml`` the NVML adapter (the only importer of
``pynvml``), ``fake`` a YAML-described library for nodes without NVML and for tests,
``sysfs`` the PCI topology read from sysfs, ``health`` the health state and its watcher thread.
"""
