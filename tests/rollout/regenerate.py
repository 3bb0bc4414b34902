"""Regeneration: what the weights a version tag names sample for a sample's prefix, with its own uniforms -- by a plain
transformers forward over the whole prefix (no KV cache, no engine code). Streaming and one-step-off samples are
checked against it (tests/rollout/test_stream.py, tests/loop/test_streaming.py) instead of trusting the tags."""

import torch

from core.models import load_causal_lm
from core.rollout.sampling import token_uniforms


def reference_models(model_dir, versions: list[dict[str, torch.Tensor]]) -> list[torch.nn.Module]:
    """A plain model per weight version (engine parameter names; tied weights are named once)."""
    models = []
    for w in versions:
        m = load_causal_lm(str(model_dir))
        missing = m.load_state_dict(w, strict=False).missing_keys
        assert set(missing) <= {"lm_head.weight"}, missing
        models.append(m)
    return models


@torch.no_grad()
def regenerate(models, prompt: list[int], tokens: list[int], versions: list[int], seed: int, temperature: float = 1.0
               ) -> tuple[list[int], list[float]]:
    """Token t drawn again by the model of version ``versions[t]`` on prompt + tokens[:t] with uniform
    token_uniforms(seed, t): (tokens, log-probs) by the inverse CDF of the tempered softmax."""
    out, logps = [], []
    for t, v in enumerate(versions):
        logits = models[v](input_ids=torch.tensor([prompt + tokens[:t]])).logits[0, -1].double() / temperature
        probs = logits.softmax(-1)
        u = float(token_uniforms([seed], [t])[0])
        tok = int(torch.searchsorted(probs.cumsum(-1), torch.tensor([u * float(probs.sum())], dtype=torch.float64),
                                     right=True).clamp(max=len(probs) - 1))
        out.append(tok)
        logps.append(float(logits.log_softmax(-1)[tok]))
    return out, logps


def check_regenerated(models, batch, shift: int = 0, temperature: float = 1.0) -> int:
    """Every sample of ``batch`` (``prompts``, ``responses``, ``rollout_versions``, ``rollout_seeds``) equals its
    regeneration: tokens exactly, log-probs to 2e-4. ``shift`` moves the version tags (a fault the check must
    catch). Returns the tokens checked."""
    Tp, checked = batch["prompts"].shape[1], 0
    for b in range(len(batch)):
        prompt = batch["prompts"][b][batch["attention_mask"][b, :Tp] > 0].tolist()
        m = batch["response_mask"][b] > 0
        tokens = batch["responses"][b][m].tolist()
        versions = [min(int(v) + shift, len(models) - 1) for v in batch["rollout_versions"][b][m]]
        ref_tok, ref_logp = regenerate(models, prompt, tokens, versions, int(batch["rollout_seeds"][b]), temperature)
        assert ref_tok == tokens, f"sample {b}: regenerated {ref_tok} != generated {tokens} (versions {versions})"
        torch.testing.assert_close(batch["rollout_logprobs"][b][m], torch.tensor(ref_logp, dtype=torch.float32),
                                   atol=2e-4, rtol=0)
        checked += len(tokens)
    return checked
