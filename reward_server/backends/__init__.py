"""Engines behind the judge and NLI protocols (see :mod:`reward_server.backends.base`)."""
