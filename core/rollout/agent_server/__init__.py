"""An OpenAI-compatible rollout server that records every trajectory token in, token out, so an agent written
against the OpenAI API trains unchanged: ``AgentServer`` (the routes' state: the engine loop, the conversations),
``Serving`` (uvicorn in a thread, on the address given), ``Conversations`` (the prompt ids of each request),
``Router`` (one URL in front of several replicas' servers: sticky per trajectory, least-loaded)."""

from core.rollout.agent_server.app import Serving, create_app
from core.rollout.agent_server.conversation import Conversations, Prompt, Segment, render_ids
from core.rollout.agent_server.engine_loop import Completion, EngineLoop
from core.rollout.agent_server.router import Router
from core.rollout.agent_server.server import AgentServer, BadRequest

__all__ = ["AgentServer", "BadRequest", "Completion", "Conversations", "EngineLoop", "Prompt", "Router", "Segment",
           "Serving", "create_app", "render_ids"]
