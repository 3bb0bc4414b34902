"""core/rollout/sglang_engine.py without SGLang (it needs torch 2.14 and CUDA; the test environment pins torch 2.13 on
CPU). The adapter drives a stand-in ``Engine`` whose methods are built from SGLang's own signatures
(tests/rollout/sglang_api/*.json, extracted from the 0.5.23 and 0.5.6 wheels' source by extract.py), so every call
and keyword it makes must bind to the real API; the stand-in's behaviour is what that source does where the adapter
depends on it: ServerArgs and SamplingParams reject unknown fields, 0.5.21+ refuses a weight update outside
begin/end_weight_update, resuming a tag that was not released raises, outputs are {"output_ids", "meta_info":
{"output_token_logprobs": [(logprob, token id, text)], "finish_reason"}}. What this proves: the translation, the
bucketing and the call sequence -- not SGLang's numerics, which these tests do not run."""

import json
from pathlib import Path

import pytest
import torch

from core.config import RolloutConfig, SamplingParams
from core.rollout.sglang_engine import SGLangEngine, SGLangError, checked, engine_kwargs, requests

API = Path(__file__).parent / "sglang_api"
VERSIONS = ("0.5.23", "0.5.6")


def api(version: str) -> dict:
    return json.loads((API / f"sglang_{version}.json").read_text())


def stand_in(version: str):
    """An Engine class with ``version``'s method signatures; it records (method, arguments) in ``Engine.calls``."""
    spec = api(version)
    session = "begin_weight_update" in spec["engine_methods"]
    state = {"released": set(), "open": False}
    calls = []

    def record(name, args):
        args = {k: v for k, v in args.items() if k != "self"}
        args |= args.pop("kwargs", {}) or {}
        calls.append((name, args))
        if name == "__init__":
            unknown = set(args) - set(spec["server_args"])
            if unknown:
                raise TypeError(f"ServerArgs has no {sorted(unknown)}")
        elif name == "generate":
            return _outputs(args, spec)
        elif name == "release_memory_occupation":
            state["released"] |= set(args["tags"] or ("kv_cache", "weights", "cuda_graph"))
        elif name == "resume_memory_occupation":
            for tag in args["tags"]:
                state["released"].remove(tag)          # KeyError for a tag that was not released, as SGLang
        elif name == "begin_weight_update":
            state["open"] = True
            return (True, "Success")
        elif name == "end_weight_update":
            state["open"] = False
            return (True, "Success")
        elif name == "update_weights_from_tensor":
            if session and not state["open"]:
                return (False, "update_weights_from_tensor must run between begin_weight_update() and "
                               "end_weight_update()")
            return (True, "Success")
        elif name == "flush_cache":
            return type("FlushCacheReqOutput", (), {"success": True, "message": ""})()

    src = ["from __future__ import annotations", "class Engine:"]
    for name, signature in spec["engine_methods"].items():
        src.append(f"    def {name}({signature}):\n        return _record({name!r}, dict(locals()))")
    ns = {"_record": record}
    exec("\n".join(src), ns)
    ns["Engine"].calls = calls
    return ns["Engine"]


def _outputs(args: dict, spec: dict) -> list[dict]:
    """Each request's tokens: (its seed + k) % 90 + 5 for k < max_new_tokens, log-prob -0.01 (k + 1)."""
    out = []
    for ids, sp in zip(args["input_ids"], args["sampling_params"]):
        unknown = set(sp) - set(spec["sampling_params"])
        if unknown:
            raise TypeError(f"SamplingParams has no {sorted(unknown)}")
        tokens = [(sp["sampling_seed"] + k) % 90 + 5 for k in range(sp["max_new_tokens"])]
        out.append({"text": "", "output_ids": tokens,
                    "meta_info": {"output_token_logprobs": [(-0.01 * (k + 1), t, None) for k, t in enumerate(tokens)],
                                  "finish_reason": {"type": "length", "length": len(tokens)},
                                  "prompt_tokens": len(ids), "completion_tokens": len(tokens)}})
    return out


class Tok:
    pad_token_id, eos_token_id = 0, 1


def adapter(version: str, model_dir, **cfg) -> SGLangEngine:
    rollout = RolloutConfig(model=str(model_dir), dtype="bfloat16", backend="sglang", gpu_memory_utilization=0.6, **cfg)
    return SGLangEngine(rollout, rank=0, device=torch.device("cpu"), tokenizer=Tok(), max_model_len=96,
                        local_rank=0, engine_cls=stand_in(version))


@pytest.mark.parametrize("version", VERSIONS)
def test_engine_and_sampling_arguments_are_fields_of_that_versions_server_and_sampling_params(version, tiny_model_dir):
    spec = api(version)
    kw = engine_kwargs(str(tiny_model_dir), RolloutConfig(backend="sglang", tensor_parallel_size=2), 96, 7, 3)
    assert set(kw) <= set(spec["server_args"])
    assert (kw["tp_size"], kw["base_gpu_id"], kw["random_seed"], kw["context_length"]) == (2, 3, 7, 96)
    assert kw["enable_memory_saver"] and kw["enable_weights_cpu_backup"] and kw["enable_deterministic_inference"]
    _, sp = requests([[5, 6]], SamplingParams(n=2, temperature=0.7, top_k=0, max_new_tokens=4, stop=("</a>",)))
    assert set(sp[0]) <= set(spec["sampling_params"])
    assert sp[0]["top_k"] == -1 and sp[0]["stop"] == ["</a>"] and sp[0]["no_stop_trim"] and sp[0]["n"] == 1


def test_generate_sends_one_seeded_request_per_sample_and_assembles_the_batch(tiny_model_dir):
    engine = adapter("0.5.23", tiny_model_dir)
    out = engine.generate([[7, 8, 9], [10]], SamplingParams(n=2, temperature=1.0, max_new_tokens=3, seed=5))
    name, args = engine.llm.calls[-1]
    assert name == "generate" and args["return_logprob"] is True
    assert args["input_ids"] == [[7, 8, 9], [7, 8, 9], [10], [10]]        # prompt-major, n in a row
    seeds = [sp["sampling_seed"] for sp in args["sampling_params"]]
    assert len(set(seeds)) == 4 and seeds[1] == seeds[0] + 1              # vLLM's scheme: seed + j for sample j
    assert out["prompts"].tolist() == [[7, 8, 9], [7, 8, 9], [0, 0, 10], [0, 0, 10]]   # left-padded
    assert out["responses"][0].tolist() == [(seeds[0] + k) % 90 + 5 for k in range(3)]
    assert torch.allclose(out["rollout_logprobs"][2], torch.tensor([-0.01, -0.02, -0.03]))
    assert out["response_mask"].sum() == 12


def test_outputs_that_do_not_add_up_are_named(tiny_model_dir):
    from core.rollout.sglang_engine import completion_rows

    good = {"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [(-0.1, 5, None), (-0.2, 6, None)]}}
    assert completion_rows([good]) == ([[5, 6]], [[-0.1, -0.2]])
    with pytest.raises(SGLangError, match="output 0: 2 tokens but 1 log-prob entries"):
        completion_rows([{"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [(-0.1, 5, None)]}}])
    with pytest.raises(SGLangError, match="log-prob entries name other tokens"):
        completion_rows([{"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [(-0.1, 5, None),
                                                                                        (-0.2, 7, None)]}}])
    with pytest.raises(SGLangError, match="SGLang aborted request 0: out of memory"):
        aborted = {"finish_reason": {"type": "abort", "message": "out of memory"}, "output_token_logprobs": []}
        completion_rows([{"output_ids": [], "meta_info": aborted}])
    with pytest.raises(SGLangError, match="Engine.update_weights_from_tensor failed: no session"):
        checked("update_weights_from_tensor", (False, "no session"))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_sync_between_two_rollouts_makes_verls_calls_in_order(version, tiny_model_dir):
    """generate, sleep, a two-bucket sync, generate: release both tags; resume weights; (0.5.21+) open the session;
    each bucket without a cache flush; close; flush once; resume the KV cache; generate."""
    engine = adapter(version, tiny_model_dir)
    params = SamplingParams(n=1, max_new_tokens=2, seed=0)
    engine.generate([[3, 4]], params)
    engine.sleep()
    sent = engine.update_weights([("model.embed_tokens.weight", torch.ones(4, 2))])
    sent += engine.update_weights([("model.norm.weight", torch.ones(2)), ("lm_head.weight", torch.ones(4, 2))])
    engine.finish_update()
    engine.generate([[3, 4]], params)
    names = [n for n, _ in engine.llm.calls]
    session = ["begin_weight_update"] if version == "0.5.23" else []
    end = ["end_weight_update"] if version == "0.5.23" else []
    assert names == ["__init__", "generate", "release_memory_occupation", "resume_memory_occupation", *session,
                     "update_weights_from_tensor", "update_weights_from_tensor", *end, "flush_cache",
                     "resume_memory_occupation", "generate"]
    args = dict(engine.llm.calls)
    assert engine.llm.calls[2][1]["tags"] == ["kv_cache", "weights"]
    assert engine.llm.calls[3][1]["tags"] == ["weights"] and engine.llm.calls[-2][1]["tags"] == ["kv_cache"]
    updates = [a for n, a in engine.llm.calls if n == "update_weights_from_tensor"]
    assert [a["flush_cache"] for a in updates] == [False, False]
    assert [n for n, _ in updates[1]["named_tensors"]] == ["model.norm.weight", "lm_head.weight"]
    assert all(t.dtype == torch.bfloat16 for a in updates for _, t in a["named_tensors"])
    assert sent == (8 + 2 + 8) * 2 and "generate" in args


def test_a_generate_after_sleep_without_a_sync_resumes_both_tags(tiny_model_dir):
    """Validation may generate right after a rollout slept: the weights come back (from SGLang's CPU backup)."""
    engine = adapter("0.5.23", tiny_model_dir)
    params = SamplingParams(n=1, max_new_tokens=2, seed=0)
    engine.generate([[3]], params)
    engine.sleep()
    engine.generate([[3]], params)
    assert [(n, a.get("tags")) for n, a in engine.llm.calls[2:5]] == [
        ("release_memory_occupation", ["kv_cache", "weights"]), ("resume_memory_occupation", ["weights"]),
        ("resume_memory_occupation", ["kv_cache"])]


def test_sglang_on_a_cpu_pool_is_refused_before_ray(tiny_model_dir):
    from tests.test_checks import run_config

    from core.checks import problems

    found = problems(run_config(rollout__backend="sglang"))
    assert found == ["rollout.backend=sglang needs CUDA GPUs, but the rollout's pool 'main' has device cpu; use "
                     "rollout.backend=embedded or vllm there"]
    with pytest.raises(ValueError, match="rollout.backend=sglang needs CUDA GPUs"):
        SGLangEngine(RolloutConfig(model=str(tiny_model_dir), backend="sglang"), 0, torch.device("cpu"), Tok(), None)
