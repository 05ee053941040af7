"""gRPC server reflection, ``grpc.reflection.v1`` and ``v1alpha``, with the proto's comments.

grpcio-reflection ships only v1alpha for Python and serves descriptors without source info
(``FileDescriptor.CopyToProto`` drops it), so ``grpcurl describe`` would show no field docs.
This servicer answers both versions (their messages are the same on the wire; only the
package differs) and serves ``reward/v1/reward.proto`` from the descriptor set generated with
``protoc --include_source_info`` (``reward_server/_proto/descriptors.binpb``); any other file
(health, the reflection protos themselves) comes from the default descriptor pool.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection_pb2 as pb

V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
V1 = "grpc.reflection.v1.ServerReflection"
METHOD = "ServerReflectionInfo"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


@functools.lru_cache(maxsize=1)
def documented_files() -> dict[str, bytes]:
    """Serialized FileDescriptorProtos with source info, by file name (ours, and reflection v1)."""
    raw = importlib.resources.files("reward_server._proto").joinpath("descriptors.binpb").read_bytes()
    out = {f.name: f.SerializeToString() for f in descriptor_pb2.FileDescriptorSet.FromString(raw).file}
    v1 = descriptor_pb2.FileDescriptorProto()  # v1alpha's messages under the v1 package
    pb.DESCRIPTOR.CopyToProto(v1)
    v1.name, v1.package = _V1_FILE, "grpc.reflection.v1"
    out[_V1_FILE] = v1.SerializeToString()
    return out


def _symbols(file_proto: descriptor_pb2.FileDescriptorProto) -> Iterable[str]:
    pkg = file_proto.package + "." if file_proto.package else ""
    for m in file_proto.message_type:
        yield from _message_symbols(m, pkg)
    for e in file_proto.enum_type:
        yield pkg + e.name
    for s in file_proto.service:
        yield pkg + s.name
        yield from (f"{pkg}{s.name}.{m.name}" for m in s.method)


def _message_symbols(m: descriptor_pb2.DescriptorProto, prefix: str) -> Iterable[str]:
    yield prefix + m.name
    for n in m.nested_type:
        yield from _message_symbols(n, f"{prefix}{m.name}.")
    for e in m.enum_type:
        yield f"{prefix}{m.name}.{e.name}"


@functools.lru_cache(maxsize=1)
def _symbol_files() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, raw in documented_files().items():
        for symbol in _symbols(descriptor_pb2.FileDescriptorProto.FromString(raw)):
            out[symbol] = name
    return out


class ReflectionServicer:
    """Answers ServerReflectionInfo streams for both reflection versions."""

    def __init__(self, service_names: Iterable[str]) -> None:
        self._services = tuple(sorted({*service_names, V1, V1ALPHA}))
        self._pool = descriptor_pool.Default()

    def _file_and_deps(self, name: str) -> list[bytes]:
        """The file and its transitive imports, each with source info where we have it."""
        seen: dict[str, bytes] = {}

        def visit(file_name: str) -> None:
            if file_name in seen:
                return
            documented = documented_files().get(file_name)
            if documented is not None:
                seen[file_name] = documented
                deps = list(descriptor_pb2.FileDescriptorProto.FromString(documented).dependency)
            else:
                fd: FileDescriptor = self._pool.FindFileByName(file_name)
                proto = descriptor_pb2.FileDescriptorProto()
                fd.CopyToProto(proto)
                seen[file_name] = proto.SerializeToString()
                deps = [d.name for d in fd.dependencies]
            for dep in deps:
                visit(dep)

        visit(name)
        return list(seen.values())

    def _files(self, request: pb.ServerReflectionRequest, file_name: str) -> pb.ServerReflectionResponse:
        try:
            files = self._file_and_deps(file_name)
        except KeyError:
            return self._not_found(request)
        return pb.ServerReflectionResponse(
            original_request=request,
            file_descriptor_response=pb.FileDescriptorResponse(file_descriptor_proto=files),
        )

    @staticmethod
    def _not_found(request: pb.ServerReflectionRequest) -> pb.ServerReflectionResponse:
        return pb.ServerReflectionResponse(
            original_request=request,
            error_response=pb.ErrorResponse(
                error_code=grpc.StatusCode.NOT_FOUND.value[0], error_message="not found"
            ),
        )

    def answer(self, request: pb.ServerReflectionRequest) -> pb.ServerReflectionResponse:
        which = request.WhichOneof("message_request")
        if which == "list_services":
            return pb.ServerReflectionResponse(
                original_request=request,
                list_services_response=pb.ListServiceResponse(
                    service=[pb.ServiceResponse(name=n) for n in self._services]
                ),
            )
        if which == "file_by_filename":
            return self._files(request, request.file_by_filename)
        if which == "file_containing_symbol":
            symbol = request.file_containing_symbol
            name = _symbol_files().get(symbol)
            if name is None:
                try:
                    name = self._pool.FindFileContainingSymbol(symbol).name
                except KeyError:
                    return self._not_found(request)
            return self._files(request, name)
        if which == "all_extension_numbers_of_type":
            try:
                message = self._pool.FindMessageTypeByName(request.all_extension_numbers_of_type)
            except KeyError:
                return self._not_found(request)
            numbers = sorted(e.number for e in self._pool.FindAllExtensions(message))
            return pb.ServerReflectionResponse(
                original_request=request,
                all_extension_numbers_response=pb.ExtensionNumberResponse(
                    base_type_name=message.full_name, extension_number=numbers
                ),
            )
        # file_containing_extension: our protos define no extensions
        return self._not_found(request)

    async def ServerReflectionInfo(
        self, requests: AsyncIterator[pb.ServerReflectionRequest], context: Any
    ) -> AsyncIterator[pb.ServerReflectionResponse]:
        async for request in requests:
            yield self.answer(request)


def reflection_handlers(
    service_names: Iterable[str],
) -> dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]:
    """Reflection v1 and v1alpha for ``service_names``: service -> its method handlers."""
    servicer = ReflectionServicer(service_names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=pb.ServerReflectionRequest.FromString,
        response_serializer=pb.ServerReflectionResponse.SerializeToString,
    )
    return {service: {METHOD: handler} for service in (V1, V1ALPHA)}
