"""Typed interface of ``api_pb2_grpc`` (written by runtimehooks.api.generate)."""

# Generated from api.proto. DO NOT EDIT.

from collections.abc import Iterator

import grpc

from koordlet.deviceplugin.api import api_pb2

class RegistrationStub:
    def __init__(self, channel: grpc.Channel) -> None: ...
    Register: grpc.UnaryUnaryMultiCallable

class RegistrationServicer:
    def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty: ...

def add_RegistrationServicer_to_server(
    servicer: RegistrationServicer, server: grpc.Server
) -> None: ...

class DevicePluginStub:
    def __init__(self, channel: grpc.Channel) -> None: ...
    GetDevicePluginOptions: grpc.UnaryUnaryMultiCallable
    ListAndWatch: grpc.UnaryStreamMultiCallable
    GetPreferredAllocation: grpc.UnaryUnaryMultiCallable
    Allocate: grpc.UnaryUnaryMultiCallable
    PreStartContainer: grpc.UnaryUnaryMultiCallable

class DevicePluginServicer:
    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions: ...
    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]: ...
    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse: ...
    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse: ...
    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse: ...

def add_DevicePluginServicer_to_server(
    servicer: DevicePluginServicer, server: grpc.Server
) -> None: ...
