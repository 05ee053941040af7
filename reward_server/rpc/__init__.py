"""Transport: protobuf <-> domain, status codes, auth, health, reflection, the grpc.aio server."""
