"""An agent's rollout stream (``core.rollout.stream`` with ``rollout.agent``) on SmolLM2-135M-Instruct in fp32 with
the real calculator: a group is its n trajectories, handed out when all have ended; a weight update lands while
turns are in flight and tools answer; every model token's log-prob is the log-prob that the weights its version
tag names give it on the whole trajectory before it (a plain transformers forward per version), tool tokens carry
no score -- and the check fails with the tags moved by one."""

import pytest
import torch

from core.config import AgentConfig, SamplingParams
from core.models import load_causal_lm, load_tokenizer
from core.protocol import Batch
from core.rollout.engine import RolloutEngine
from core.rollout.sampling import sequence_seeds
from core.rollout.stream import StreamState
from tests.test_agent_loop import ONE_SHOT

MODEL, T = "SmolLM2-135M-Instruct", 0.7
AGENT = AgentConfig(enable=True, max_turns=3, max_response_tokens=96)


@pytest.fixture(scope="module")
def versions():
    v0 = {k: p.detach().clone() for k, p in load_causal_lm(MODEL).named_parameters()}
    g = torch.Generator().manual_seed(0)
    v1 = {k: v + 0.02 * v.std() * torch.randn(v.shape, generator=g) for k, v in v0.items()}
    return [v0, v1]


@torch.no_grad()
def teacher_forced(models, batch, shift=0):
    """Each model token's log-prob under the version its tag names (+ ``shift``), on the prompt and the whole
    response before it (tool tokens included)."""
    Tp, out = batch["prompts"].shape[1], torch.zeros_like(batch["rollout_logprobs"])
    for b in range(len(batch)):
        ids = batch["input_ids"][b][batch["attention_mask"][b] > 0][None]
        p = int(batch["attention_mask"][b, :Tp].sum())
        for v in batch["rollout_versions"][b][batch["response_mask"][b] > 0].unique().tolist():
            model = models[min(int(v) + shift, len(models) - 1)]
            logp = (model(input_ids=ids).logits[0, p - 1:-1].double() / T).log_softmax(-1)
            real = ids[0, p:]
            lp = logp.gather(-1, real[:, None]).squeeze(-1).float()
            at = (batch["rollout_versions"][b, :len(real)] == v) & (batch["response_mask"][b, :len(real)] > 0)
            out[b, :len(real)][at] = lp[at]
    return out


@pytest.mark.heavy  # SmolLM2 turns with tools and two reference forwards per trajectory, ~40 s
def test_agent_groups_stream_across_an_update_and_their_tokens_are_their_versions(versions):
    tok = load_tokenizer(MODEL)
    engine = RolloutEngine(load_causal_lm(MODEL), tok, max_batch_size=8)
    engine.update_weights(versions[0].items())
    params = SamplingParams(n=2, temperature=T, max_new_tokens=48, seed=0)
    s = StreamState(engine, params, max_prompt_length=256, agent=AGENT, eos_ids=engine.eos_ids)
    prompts = [ONE_SHOT + [{"role": "user", "content": f"What is {a} * {b}?"}] for a, b in ((123, 456), (87, 65))]
    s.add(engine.chat_prompt_ids(prompts), sequence_seeds(1, 4), keys=["x", "y"])
    got, started, k = [], {}, 0
    while s.members:
        done, st = s.advance(4)
        started |= st
        got += [done] if done is not None else []
        k += 1
        if k == 3:
            engine.update_weights(versions[1].items())
            s.reweighted()
    out = Batch.concat(got)
    assert sorted(set(out["stream_key"])) == ["x", "y"] and len(out) == 4 and started == {"x": 0, "y": 0}
    assert (out["num_turns"] > 1).any(), "no tool answer: the test checks nothing"
    m = out["response_mask"] > 0
    assert set(out["rollout_versions"][m].unique().tolist()) == {0.0, 1.0}
    assert ((out["attention_mask"][:, out["prompts"].shape[1]:] > 0) & ~m).any()       # tool tokens in between
    models = []
    for w in versions:
        model = load_causal_lm(MODEL)
        model.load_state_dict(w, strict=False)
        models.append(model)
    torch.testing.assert_close(out["rollout_logprobs"][m], teacher_forced(models, out)[m], atol=2e-3, rtol=0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out["rollout_logprobs"][m], teacher_forced(models, out, shift=1)[m],
                                   atol=2e-3, rtol=0)
