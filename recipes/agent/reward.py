"""This recipe's reward (verl signature), by data source -- edit this function to change the reward. The solution
string is the model's own text (its turns, tool answers left out); agent rollouts add ``num_turns`` (model turns)
and ``num_tool_calls`` to ``extra_info``.

- ``hybridrl/agent_mult`` (the CPU tier; core's rule, ``core.rewards``): 1.0 when the last number of the model's
  text after its last tool call is the product, else 0.0 (a last number ending a list or an alternative, '3 or 4',
  is none). Numbers inside a tool call do not count: an unanswered call scores 0.
  Examples vs '56088': '<tool_call>...</tool_call>The answer is 56088.' -> 1.0; '123 * 456 = 56088' -> 1.0
  (no tool, still right); '<tool_call>{... "123 * 456"}</tool_call>' -> 0.0 (no answer after the call).
- ``math_dapo`` / ``aime24`` (the ReTool script): ReTool (arXiv:2504.11536) and verl's recipe/retool: +1 when the last
  ``\\boxed{}`` equals the ground truth, else -1 raised by 0.1 per tool round, capped at -0.6:
  ``min(-0.6, -1 + 0.1 * (num_turns - 1))`` -- verl's ``(turns - 2) / 2 * 0.1`` counts messages (prompt, each
  assistant turn, each tool answer); with our model-turn count that is ``num_turns - 1`` tool rounds.
  Example: wrong after 3 tool rounds (num_turns 4) -> min(-0.6, -0.7) = -0.7; right -> 1.0.
"""

from core.rewards import default_compute_score
from core.rewards.math_answer import boxed_answer, is_equiv

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source in ("math_dapo", "aime24"):
        pred = boxed_answer(solution_str)
        acc = pred is not None and is_equiv(pred, str(ground_truth))
        turns = int((extra_info or {}).get("num_turns", 1))
        score = 1.0 if acc else min(-0.6, -1.0 + 0.1 * (turns - 1))
        return {"score": score, "acc": acc, "pred": pred or ""}
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
