"""The CPU tier's task written as agents are written for any OpenAI-compatible endpoint: a plain loop with the
``openai`` client -- the calculator declared in OpenAI's tool schema, answered by the sandbox's calculator -- trained
unchanged through the rollout server (``rollout.agent.runner: openai_agent.py:run`` in openai_cpu.yaml), as
config.yaml trains the same task with the built-in agent loop.

``run(client, row)`` is called n times per data row per step, many at once; ``client`` is an ``openai.AsyncOpenAI``
whose requests are recorded, token in, token out, as this sample's trajectory. It returns the final answer -- the
recipe's reward (reward.py) scores it against the row's ground truth -- and its failed tool calls.
"""

import asyncio
import json

from core.tools.builtin import TOOLS
from core.tools.sandbox import SandboxLimits

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression, e.g. 123 * 456.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
MAX_TURNS = 3  # as config.yaml's rollout.agent.max_turns
LIMITS = SandboxLimits(timeout_s=5.0, max_output_bytes=256)


async def run(client, row: dict) -> dict:
    """Ask; run each calculator call the reply makes and send its result back; stop at a reply without calls (the
    answer) or after MAX_TURNS replies (an unanswered call: no answer). Returns the answer and how many calls failed
    (the run's agent/tool_error_rate)."""
    messages, errors = list(row["prompt"]), 0
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"answer": message.content or "", "tool_errors": errors}
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                arguments = {}
            if call.function.name == "calculator":  # off the event loop: the other agents go on meanwhile
                result = await asyncio.to_thread(TOOLS["calculator"], arguments, LIMITS)
                text, errors = result.text, errors + (not result.ok)
            else:
                text, errors = f"error: unknown tool {call.function.name!r}; the tools are ['calculator']", errors + 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return {"answer": "", "tool_errors": errors}
