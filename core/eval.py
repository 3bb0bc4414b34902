"""``python -m core.eval --model M --data gsm8k|FILE.parquet [...]``: score a model on a dataset.

n samples per problem through the embedded rollout engine, scored by the reward registry, reported per
data source as pass@1 (mean accuracy over all samples), avg@n (mean score), maj@n (majority vote over the
extracted answers) and pass@k (unbiased estimator, Chen et al. 2021) -- as a markdown table and JSON.
Recipes and the bench call ``evaluate`` / ``evaluate_rows`` directly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from math import comb
from pathlib import Path
from typing import Callable, Sequence

import torch

from core.config import SamplingParams
from core.rollout.engine import RolloutEngine
from core.rewards import default_compute_score, score_batch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k). Example: n=4, c=1, k=2 -> 0.5."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def majority_correct(preds: Sequence[str], accs: Sequence[bool]) -> bool:
    """Is the most frequent non-empty answer a correct one? (ties: the answer seen first)."""
    counted = Counter(p for p in preds if p)
    if not counted:
        return False
    best = max(counted, key=lambda p: (counted[p], -preds.index(p)))
    return any(a for p, a in zip(preds, accs) if p == best)


def summarize(rows: list[dict], n: int, ks: Sequence[int]) -> dict[str, dict]:
    """Per data source metrics from per-sample results (rows: data_source, problem, score, acc, pred, length)."""
    by_source: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_source[r["data_source"]][r["problem"]].append(r)
    out = {}
    for source, problems in sorted(by_source.items()):
        samples = [s for group in problems.values() for s in group]
        m = {"problems": len(problems), "samples": len(samples),
             "pass@1": sum(s["acc"] for s in samples) / len(samples),
             f"avg@{n}": sum(s["score"] for s in samples) / len(samples),
             f"maj@{n}": sum(majority_correct([s["pred"] for s in g], [s["acc"] for s in g])
                             for g in problems.values()) / len(problems),
             "response_length/mean": sum(s["length"] for s in samples) / len(samples)}
        for k in ks:
            m[f"pass@{k}"] = sum(pass_at_k(len(g), sum(s["acc"] for s in g), k) for g in problems.values()) / len(problems)
        out[source] = m
    return out


def markdown_table(results: dict[str, dict]) -> str:
    keys = list(next(iter(results.values())).keys())
    lines = ["| data source | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for source, m in results.items():
        cells = [f"{v:.4f}" if isinstance(v, float) else str(v) for v in m.values()]
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def evaluate_rows(engine: RolloutEngine, rows: list[dict], params: SamplingParams, ks: Sequence[int] = (),
                  reward_fn: Callable = default_compute_score, reward_source: str | None = None,
                  num_workers: int = 0) -> tuple[dict[str, dict], list[dict]]:
    """Generate ``params.n`` samples for every row (verl-schema rows from ``core.data.dataset``), score them.

    ``reward_source`` scores every row under another registry key (e.g. ``gsm8k_flexible``) while reporting it
    under its own data source. Returns (metrics per data source, per-sample records)."""
    prompt_ids = engine.chat_prompt_ids([r["prompt"] for r in rows])
    out = engine.generate(prompt_ids, params)
    owners = [rows[i // params.n] for i in range(len(out))]
    return score_samples(owners, engine.decode(out), out["response_mask"].sum(-1).tolist(), params.n, ks,
                         reward_fn, reward_source, num_workers)


def score_samples(owners: list[dict], texts: list[str], lengths: list[int], n: int, ks: Sequence[int] = (),
                  reward_fn: Callable = default_compute_score, reward_source: str | None = None,
                  num_workers: int = 0, timeout_s: float = 10.0, fallback: float | None = None
                  ) -> tuple[dict[str, dict], list[dict]]:
    """Score generated texts (sample i belongs to row ``owners[i]``, n consecutive samples per problem) and
    summarise per data source. The training loop's validation calls this on what its rollout workers generated."""
    scored = score_batch(reward_fn, [reward_source or r["data_source"] for r in owners], texts,
                         [r["ground_truth"] for r in owners], [r["extra_info"] for r in owners],
                         num_workers=num_workers, timeout_s=timeout_s, fallback=fallback)
    accs = scored.extras.get("acc", [float(s) > 0 for s in scored.scores])
    preds = scored.extras.get("pred", [""] * len(texts))
    samples = [{"data_source": o["data_source"], "problem": i // n, "score": float(s), "acc": bool(a),
                "pred": str(p), "length": int(m), "response": t}
               for i, (o, s, a, p, m, t) in enumerate(zip(owners, scored.scores, accs, preds, lengths, texts))]
    return summarize(samples, n, ks), samples


def parser() -> argparse.ArgumentParser:
    """``hybridrl eval``'s arguments."""
    class Formatter(argparse.RawDescriptionHelpFormatter):
        def _get_help_string(self, action):  # the default, where there is one the help does not already say
            text = action.help or ""
            d = action.default
            shown = d is not None and d is not False and d != [] and d != argparse.SUPPRESS and "default" not in text
            return f"{text} (default: {action.default})" if shown else text

    from core.data.prepare import SRC_HELP

    p = argparse.ArgumentParser(prog="hybridrl eval", description="score a model on a benchmark: each dataset's "
                                "problems sampled by the rollout engine, scored by its reward, pass@k reported",
                                epilog="example:\n  hybridrl eval --model SmolLM2-135M-Instruct --data gsm8k --limit 50 "
                                       "--temperature 0 --out eval_out", formatter_class=Formatter)
    p.add_argument("--model", required=True, help="HF id or local folder (SmolLM2-135M-Instruct works offline)")
    p.add_argument("--data", required=True, action="append", help="dataset name (gsm8k, aime24, ...) or a parquet file")
    p.add_argument("--split", default="test", help="the dataset split to score (a dataset name's file)")
    p.add_argument("--src", default=None, help=SRC_HELP)
    p.add_argument("--template", default="{question}", help="prompt template for dataset names (format string or @file)")
    p.add_argument("--limit", type=int, default=None, help="first N problems of each dataset")
    p.add_argument("--n", type=int, default=1, help="samples per problem")
    p.add_argument("--k", type=int, action="append", default=[], help="report pass@k (repeatable; k <= n)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the smallest set of tokens of this mass")
    p.add_argument("--top-k", type=int, default=-1, help="the k most likely tokens only (-1: off)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="response length limit in tokens")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="auto: bf16 on CUDA or CPUs with AMX/AVX512-BF16, else fp32")
    p.add_argument("--batch-size", type=int, default=64, help="sequences the engine decodes at once")
    p.add_argument("--reward-source", default=None, help="score under this reward key instead of each row's data_source")
    p.add_argument("--out", default=None, help="folder for results.json and samples.jsonl")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)

    from core.config.errors import ConfigError, did_you_mean
    from core.data.dataset import load_rl_parquet, validate_row
    from core.data.prepare import DATASETS, make_rows, read_records
    from core.models import load_causal_lm, load_tokenizer, resolve_dtype

    rows = []
    template = Path(a.template[1:]).read_text() if a.template.startswith("@") else a.template
    for data in a.data:
        if data.endswith(".parquet"):
            rows += load_rl_parquet(data, a.limit)
        elif data not in DATASETS:
            raise ConfigError(f"--data {data}: neither a dataset name ({', '.join(sorted(DATASETS))}) nor a "
                              f".parquet file{did_you_mean(data, DATASETS)}", key="--data")
        else:  # --src None: the local copy in DEFAULT_SRC when there, else the hub (core.data.prepare)
            records, where = read_records(data, a.split, a.src)
            made, _ = make_rows(data, a.split, records[:a.limit] if a.limit else records, where, template)
            rows += [validate_row(r, f"{where}: row {i + 1}") for i, r in enumerate(made)]
    torch.manual_seed(a.seed)
    dtype = resolve_dtype(a.dtype)
    engine = RolloutEngine(load_causal_lm(a.model, dtype=dtype), load_tokenizer(a.model), a.batch_size,
                           single_copy=True)
    params = SamplingParams(n=a.n, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                            max_new_tokens=a.max_new_tokens, seed=a.seed)
    t = time.perf_counter()
    results, samples = evaluate_rows(engine, rows, params, a.k, reward_source=a.reward_source)
    elapsed = time.perf_counter() - t
    tokens = sum(s["length"] for s in samples)
    print(f"model {a.model} | {len(rows)} problems x n={a.n} | T={a.temperature} | {str(dtype).removeprefix('torch.')} | "
          f"{elapsed:.0f}s, {tokens / elapsed:.0f} response tokens/s")
    print(markdown_table(results))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"model": a.model, "params": vars(a), "results": results,
                                                      "seconds": elapsed}, indent=1))
        with (out / "samples.jsonl").open("w") as f:
            f.writelines(json.dumps(s) + "\n" for s in samples)
        print(f"wrote {out / 'results.json'} and {out / 'samples.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
