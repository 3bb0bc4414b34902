"""Token in, token out for agents that speak the OpenAI chat API: each request's prompt ids are the ids its
trajectory already holds -- the first request's rendered prompt, then every sampled token and every template
fragment appended since -- plus the template's text for the messages the request adds. Nothing is re-tokenised:
an assistant reply the agent sends back is matched, not rendered again, so the trainer scores exactly the tokens the
engine sampled, on exactly the context it sampled them in.

Re-rendering the whole conversation each turn (what a plain OpenAI-compatible server does) goes wrong in two ways
this module detects (``Prompt.drift``: the ids a re-render would have given differ): the reply's text re-tokenises
to other ids than were sampled (a merge across the boundary with the next turn's tokens, or the tool calls the
template renders from ``tool_calls`` in its own format), and templates that are not prefix-stable (a later turn
changes how an earlier one renders, as templates that drop earlier turns' reasoning do).

A request whose messages do not extend any state of its trajectory (the agent rewrote or summarised its history,
or changed its tools) starts a new segment of that trajectory, with the reason (``Prompt.split``); a second reply
from one state (``n`` > 1, or an agent's parallel branches) forks it. Every segment trains as a trajectory of its own
(``Conversations.finished``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from core.rollout.agent_loop import Trajectory
from core.tools.chat import continuation_text

RAW = "<token prompts>"  # the tools key of /v1/completions records: no chat request extends them

# what the tools cost a template that does not render them itself (SmolLM2's): the Hermes / Qwen2.5 convention
_TOOLS_SYSTEM = ("You may call one or more functions to assist with the user query. The functions are listed in "
                 "<tools></tools>:\n<tools>\n{tools}\n</tools>\nFor each call, write <tool_call>{{\"name\": <function "
                 "name>, \"arguments\": <arguments as JSON>}}</tool_call> and wait for its result.")


def _text(content: Any) -> str:
    """A message's content as text: a string, None, or a list of text parts (OpenAI's content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def canonical(message: dict) -> dict:
    """A message as two requests are compared by: role, content text, tool calls (name and parsed arguments, not
    their ids), tool_call_id and name. Raises ValueError naming what is malformed."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError("a message needs a \"role\" string")
    out = {"role": message["role"], "content": _text(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        try:
            out["tool_calls"] = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                                 for c in calls]
        except (KeyError, TypeError):
            raise ValueError("tool_calls: each needs {\"function\": {\"name\": ..., \"arguments\": ...}}") from None
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def template_message(m: dict) -> dict:
    """A canonical message as chat templates read it (tool calls as {"type": "function", "function": {...}})."""
    out = {k: v for k, v in m.items() if k != "tool_calls"}
    if "tool_calls" in m:
        out["tool_calls"] = [{"type": "function", "function": c} for c in m["tool_calls"]]
    return out


def render_ids(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None, describe: bool = True) -> list[int]:
    """The template's ids for a whole conversation, ready for the assistant's turn. Tools go to the template when it
    renders them, else (``describe``) into the system message in the Hermes convention."""
    msgs = [template_message(m) for m in messages]
    if tools and describe and "tools" not in (tokenizer.chat_template or ""):
        text = _TOOLS_SYSTEM.format(tools="\n".join(json.dumps(t) for t in tools))
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + text}
        else:
            msgs.insert(0, {"role": "system", "content": text})
    ids = tokenizer.apply_chat_template(msgs, tools=list(tools) if tools else None, add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return list(ids)


@dataclass
class Segment:
    """One trajectory's latest state: its ids (``traj``: the prompt, then sampled tokens and template fragments)
    and the canonical messages they hold (the last one its own reply)."""
    traj: Trajectory
    messages: list[dict]
    tools: str
    end_token: int | None = None     # the last reply's final token when it closed the turn (an EOS id)
    split: str = ""                  # why this segment started apart from the trajectory's others
    drift: int = 0                   # turns whose re-rendered prompt would have differed from these ids


@dataclass
class Prompt:
    """A request's prompt: ``ids`` to sample from, the segment it extends (None: a new one) and what it adds."""
    trajectory: str
    ids: list[int]
    messages: list[dict]
    tools: str
    parent: Segment | None
    at: tuple[int, int, int] = (0, 0, 0)             # the parent's tokens, turns and tool calls when prompted
    added: list[int] = field(default_factory=list)   # template ids after the parent's (masked out of the loss)
    split: str = ""
    drift: bool = False
    tool_messages: int = 0                           # tool answers among the messages added


class Conversations:
    """Every trajectory's segments, by trajectory id. Thread-safe (the server's requests arrive concurrently)."""

    def __init__(self, tokenizer, eos_ids: Sequence[int], describe_tools: bool = True):
        self.tok, self.eos, self.describe = tokenizer, set(eos_ids), describe_tools
        self.segments: dict[str, list[Segment]] = {}
        self.lock = threading.Lock()

    def prompt(self, trajectory: str, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> Prompt:
        """The prompt ids of a chat request of ``trajectory``. Raises ValueError naming a malformed message."""
        norm = []
        for i, m in enumerate(messages):
            try:
                norm.append(canonical(m))
            except ValueError as e:
                raise ValueError(f"messages[{i}]: {e}") from None
        if not norm:
            raise ValueError("messages: at least one message")
        tkey = json.dumps(list(tools or []), sort_keys=True)
        with self.lock:
            own = self.segments.get(trajectory, [])
            parents = [s for s in own if s.tools == tkey and len(s.messages) < len(norm)
                       and norm[:len(s.messages)] == s.messages]
        whole = render_ids(self.tok, norm, tools, self.describe)  # what re-rendering would give: the drift check, or a new segment
        if not parents:
            why = _why_apart(own, norm, tkey) if own else ""
            return Prompt(trajectory, whole, norm, tkey, None, split=why)
        parent = max(parents, key=lambda s: len(s.messages))
        added = self.tok(continuation_text(self.tok, [template_message(m) for m in norm[len(parent.messages):]]),
                         add_special_tokens=False)["input_ids"]
        if parent.end_token is not None and added[:1] == [parent.end_token]:
            added = added[1:]  # the reply's sampled EOS is the template's end of turn
        ids = parent.traj.prompt + parent.traj.tokens + added
        at = _state(parent)
        answers = sum(m["role"] == "tool" for m in norm[len(parent.messages):])
        return Prompt(trajectory, ids, norm, tkey, parent, at, added, drift=ids != whole, tool_messages=answers)

    def prompt_ids(self, trajectory: str, ids: Sequence[int]) -> Prompt:
        """A token prompt (``/v1/completions``): it continues the trajectory's record it extends, if any."""
        ids = list(ids)
        with self.lock:
            own = [s for s in self.segments.get(trajectory, []) if s.tools == RAW]
            parents = [s for s in own if len(s.traj.prompt) + len(s.traj.tokens) < len(ids)
                       and ids[:len(s.traj.prompt) + len(s.traj.tokens)] == s.traj.prompt + s.traj.tokens]
        if not parents:
            return Prompt(trajectory, ids, [], RAW, None,
                          split="the prompt extends none of the trajectory's token records" if own else "")
        parent = max(parents, key=lambda s: len(s.traj.tokens))
        return Prompt(trajectory, ids, [], RAW, parent, _state(parent),
                      ids[len(parent.traj.prompt) + len(parent.traj.tokens):])

    def reply(self, p: Prompt, tokens: list[int], logps: list[float], versions: Sequence[int], message: dict
              ) -> Segment:
        """Record a completion of ``p``: its parent grown in place (one record per trajectory) when nothing has
        grown it since ``p`` was made, else a fork of the parent as ``p`` saw it, or a new segment."""
        with self.lock:
            parent = p.parent
            if parent is None:
                seg = Segment(Trajectory(list(p.ids)), [], p.tools, split=p.split)
                self.segments.setdefault(p.trajectory, []).append(seg)
            elif _state(parent) == p.at:
                seg = parent
            else:  # a second reply from one state: a fork with the state's record as the prompt saw it
                n, turns, calls_at = p.at
                t = parent.traj
                seg = Segment(Trajectory(list(t.prompt), tokens=t.tokens[:n], sampled=t.sampled[:n], logps=t.logps[:n],
                                         versions=t.versions[:n], turns=turns, num_calls=calls_at), [], p.tools,
                              drift=parent.drift)
                self.segments[p.trajectory].append(seg)
            if parent is not None:
                seg.traj.add(p.added, [], sampled=False)
                seg.traj.num_calls += p.tool_messages
            seg.traj.add(tokens, logps, sampled=True, versions=versions)
            seg.traj.turns += 1
            seg.messages = p.messages + [canonical(message)]
            seg.end_token = tokens[-1] if tokens and tokens[-1] in self.eos else None
            seg.traj.at_eos = seg.end_token is not None
            seg.drift += p.drift
            return seg

    def finished(self, trajectory: str) -> list[Segment]:
        """The trajectory's segments, oldest first; the record is forgotten here."""
        with self.lock:
            return self.segments.pop(trajectory, [])


def _state(seg: Segment) -> tuple[int, int, int]:
    """What a reply checks its parent against (nothing grew it since the prompt): its tokens, turns, tool calls."""
    return len(seg.traj.tokens), seg.traj.turns, seg.traj.num_calls


def _why_apart(own: list[Segment], norm: list[dict], tkey: str) -> str:
    """Why a request of a known trajectory extends none of its segments: the first message that differs."""
    best = max(own, key=lambda s: _common(s.messages, norm))
    if best.tools != tkey:
        return "the request's tools differ from the trajectory's"
    k = _common(best.messages, norm)
    if k == len(norm):
        return f"the request repeats the trajectory's first {k} messages and adds none"
    return f"messages[{k}] differs from the trajectory's (history rewritten)"


def _common(a: list[dict], b: list[dict]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k
