"""Personalized reward server: PARL rubric rewards and NLICV constraint rewards over gRPC."""

__version__ = "0.1.0"
API_VERSION = "reward.v1"
