"""Transport: the gRPC and HTTP/JSON doors, status codes, auth, health, reflection, the grpc.aio
server (the reward.v1 codec they use is :mod:`reward_server.api`)."""
