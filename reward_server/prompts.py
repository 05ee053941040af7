"""The prompts a trainer writes into its rows, from the science that owns them.

The rubric generator's request (PARL's released wording, :mod:`reward_server.rubric.templates`)
and the rendering of a user's history are the same text the server induces rubrics with, so a
trainer renders them through this face instead of keeping its own copy or reaching into the
science package.
"""

from __future__ import annotations

from reward_server.rubric.templates import TASK_LABELS, generator_request, render_history

__all__ = ["TASK_LABELS", "generator_request", "render_history"]
