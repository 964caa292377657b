"""gpushare's ``aliyun.com/gpu-mem`` kubelet device plugin: ``gpushare`` (pure protocol) and
``server`` (the gRPC adapter), with the kubelet's deviceplugin/v1beta1 API in ``api``."""
