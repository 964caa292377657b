"""The kubelet's deviceplugin/v1beta1 API (``api.proto``) and its generated modules."""
