"""Reading verl-schema parquet (ours or verl's) into rows the trainer and eval use, with named errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.data.multimodal import count_placeholders, images_of

REQUIRED = ("data_source", "prompt", "reward_model")


def validate_row(row: dict, where: str) -> dict:
    """Check one row's schema; raise ValueError naming ``where`` (file and row) and the key."""
    for key in REQUIRED:
        if key not in row or row[key] is None:
            raise ValueError(f"{where}: missing key {key!r}")
    prompt = row["prompt"]
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) and "content" in m for m in prompt):
        raise ValueError(f"{where}: key 'prompt' must be a non-empty chat list of {{role, content}} dicts")
    rm = row["reward_model"]
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise ValueError(f"{where}: key 'reward_model' needs a 'ground_truth'")
    extra = row.get("extra_info")
    out = {"data_source": row["data_source"], "prompt": [dict(m) for m in prompt],
           "ground_truth": rm["ground_truth"], "extra_info": dict(extra) if isinstance(extra, dict) else {},
           "ability": row.get("ability"), "where": where}
    if row.get("images") is not None or count_placeholders(out["prompt"]):  # verl's multimodal rows
        out["images"] = images_of({"prompt": out["prompt"], "images": row.get("images")}, where)
    if row.get("messages") is not None:  # an SFT row: the whole conversation to train on (core.sft)
        messages = row["messages"].tolist() if hasattr(row["messages"], "tolist") else row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(f"{where}: key 'messages' must be a chat list of {{role, content}} dicts")
        out["messages"] = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    return out


def load_rl_parquet(paths: str | Path | list, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of one or more verl-schema parquet files: {data_source, prompt, ground_truth, extra_info, ability}."""
    import pandas as pd

    rows = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        df = pd.read_parquet(path)
        for i, row in enumerate(df.to_dict("records")):
            rows.append(validate_row(row, f"{path}: row {i + 1}"))
            if limit and len(rows) >= limit:
                return rows
    return rows


TRUNCATIONS = ("error", "left", "right")


def fit_prompt_lengths(rows: list[dict], tokenizer, max_len: int, truncation: str = "error",
                       filter_overlong: bool = False, processor=None) -> tuple[list[dict], str]:
    """Tokenize every prompt once (the chat template with its generation prompt, as the rollout engine does) and
    make each fit ``max_len`` tokens (``rollout.max_prompt_length``); returns the rows and a one-line report.

    ``filter_overlong``: drop the overlong rows (counted in the report). Else ``truncation``: ``error`` raises naming
    each overlong row's file, row and length (the first 5); ``left`` keeps a prompt's last ``max_len`` tokens,
    ``right`` its first (verl's ``data.truncation``). With ``left`` / ``right`` every row carries its token ids
    (``prompt_ids``), which the rollout then uses instead of tokenizing the chat again.

    Image rows (``images``) are measured through the model's ``processor``, each image's token run included, and
    are never truncated (a cut through an image's tokens breaks the model's image-token count): an overlong one is
    dropped (``filter_overlong``) or an error."""
    from core.models import chat_prompt_ids

    if truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation must be one of {TRUNCATIONS}, got {truncation!r}")
    images = any("images" in r for r in rows)
    if images and processor is None:
        first = next(r for r in rows if "images" in r)
        raise ValueError(f"{first.get('where', 'a row')}: image prompts, but the rollout model has no image processor "
                         "(rollout.model must be a vision-language model folder with a processor_config.json)")
    if images:
        from core.data.vision_inputs import vision_prompt_ids

        ids = [vision_prompt_ids(processor, [r["prompt"]], [r.get("images", [])])[0][0] for r in rows]
        truncation = "error" if not filter_overlong else truncation
    else:
        ids = chat_prompt_ids(tokenizer, [r["prompt"] for r in rows])
    over = [i for i, x in enumerate(ids) if len(x) > max_len]
    longest = max(map(len, ids), default=0)
    if filter_overlong:
        keep = set(range(len(rows))) - set(over)
        return [r for i, r in enumerate(rows) if i in keep], (f"{len(over)} of {len(rows)} prompts longer than "
                                                             f"{max_len} tokens dropped (data.filter_overlong_prompts)")
    if over and truncation == "error":
        shown = "; ".join(f"{rows[i].get('where', f'row {i + 1}')}: {len(ids[i])} tokens" for i in over[:5])
        raise ValueError(f"{len(over)} prompt(s) longer than rollout.max_prompt_length={max_len} tokens: {shown}"
                         f"{' ...' if len(over) > 5 else ''}. Raise rollout.max_prompt_length (longest: {longest}), "
                         "or set data.filter_overlong_prompts=true or data.truncation=left|right")
    if truncation == "error":
        return rows, f"prompts fit rollout.max_prompt_length={max_len} (longest {longest} tokens)"
    cut = (lambda x: x[-max_len:]) if truncation == "left" else (lambda x: x[:max_len])
    rows = [r | {"prompt_ids": cut(x) if len(x) > max_len else x} for r, x in zip(rows, ids)]
    return rows, f"{len(over)} of {len(rows)} prompts truncated ({truncation}) to {max_len} tokens"
