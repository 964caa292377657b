"""Typed interface of ``api_pb2_grpc`` (written by runtimehooks.api.generate)."""

# Generated from api.proto. DO NOT EDIT.

import grpc

from runtimehooks.api import api_pb2

class RuntimeHookServiceStub:
    def __init__(self, channel: grpc.Channel) -> None: ...
    PreRunPodSandboxHook: grpc.UnaryUnaryMultiCallable
    PostStopPodSandboxHook: grpc.UnaryUnaryMultiCallable
    PreCreateContainerHook: grpc.UnaryUnaryMultiCallable
    PreStartContainerHook: grpc.UnaryUnaryMultiCallable
    PostStartContainerHook: grpc.UnaryUnaryMultiCallable
    PostStopContainerHook: grpc.UnaryUnaryMultiCallable
    PreUpdateContainerResourcesHook: grpc.UnaryUnaryMultiCallable

class RuntimeHookServiceServicer:
    def PreRunPodSandboxHook(
        self, request: api_pb2.PodSandboxHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.PodSandboxHookResponse: ...
    def PostStopPodSandboxHook(
        self, request: api_pb2.PodSandboxHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.PodSandboxHookResponse: ...
    def PreCreateContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerResourceHookResponse: ...
    def PreStartContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerResourceHookResponse: ...
    def PostStartContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerResourceHookResponse: ...
    def PostStopContainerHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerResourceHookResponse: ...
    def PreUpdateContainerResourcesHook(
        self, request: api_pb2.ContainerResourceHookRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerResourceHookResponse: ...

def add_RuntimeHookServiceServicer_to_server(
    servicer: RuntimeHookServiceServicer, server: grpc.Server
) -> None: ...
