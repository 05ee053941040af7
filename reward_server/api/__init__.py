"""The client-safe face of reward.v1: what a client, a trainer and the server's doors share.

- :mod:`reward_server.api.kinds`: THE table of each reward kind's facts (its proto field, its
  response field, its components; the fixed components a trainer logs for an item of any
  shape), read by every door, the client side and the server's own kind declarations;
- :mod:`reward_server.api.convert`: protobuf <-> domain, message by message;
  :mod:`reward_server.api.score_call`: a whole Score call's items and results, converted one at
  a time; :mod:`reward_server.api.wire`: request bodies split and parsed as bytes;
- :mod:`reward_server.api.jsonmap`: THE JSON convention of reward.v1 messages;
- :mod:`reward_server.api.rows`: the training-row contract (each row's ScoreItem template,
  written by ``python -m trainer.data.prepare`` and read by verl, TRL and OpenRLHF alike).

It imports only the shared leaves (the domain, the components' declarations, the errors, the
cooperative turnstile) and the generated ``_proto``: never the transport, the service, the
hosting, the science or the engines (tests/unit/test_layers.py), so the client, the
framework integrations and the trainer stay light, and the server imports it from above.
"""
