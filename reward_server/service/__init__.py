"""Orchestration: validate, admit, fan out to the science, aggregate (transport- and
Ray-agnostic).

- :mod:`reward_server.service.service`: :class:`RewardService`, the four API operations;
- :mod:`reward_server.service.validation`: request limits and semantic validation, turning a
  request into a :class:`ValidatedBatch` (its judgments counted, its defaults resolved);
- :mod:`reward_server.service.admission`: admission control (judgments and bytes in flight);
- :mod:`reward_server.service.settings`: the ``service`` block of the config.

The reward kinds it dispatches over are declared in :mod:`reward_server.kinds`.
"""

from __future__ import annotations

from reward_server.service.admission import Admission, Ticket
from reward_server.service.service import RewardService, admission_for
from reward_server.service.settings import AdmissionSettings, ServiceSettings
from reward_server.service.validation import BatchCheck, Induction, Limits, ValidatedBatch, Validator

__all__ = [
    "Admission", "AdmissionSettings", "BatchCheck", "Induction", "Limits", "RewardService",
    "ServiceSettings", "Ticket", "ValidatedBatch", "Validator", "admission_for",
]
