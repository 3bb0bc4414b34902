"""verl's multimodal rows (core/data/multimodal.py): placeholders counted against images with errors that name the
file and row, images decoded once from every form parquet and users give them in, chats split for templates."""

import pytest
from PIL import Image

from core.data.dataset import load_rl_parquet
from core.data.multimodal import chat_content, images_of, png_bytes
from core.data.prepare import write_parquet


def red(size=8):
    return Image.new("RGB", (size, size), (255, 0, 0))


def row(content, images):
    return {"data_source": "t", "prompt": [{"role": "user", "content": content}], "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": "red"}, "images": images}


def test_images_decode_from_bytes_dicts_paths_and_pil(tmp_path):
    path = tmp_path / "x.png"
    red().save(path)
    r = row("<image><image><image><image>Which?", [png_bytes(red()), {"path": str(path)}, red(), path.read_bytes()])
    got = images_of(r, "f: row 1")
    assert len(got) == 4 and all(im.mode == "RGB" and im.getpixel((0, 0)) == (255, 0, 0) for im in got)


def test_a_count_mismatch_names_the_file_and_row_before_anything_runs(tmp_path):
    rows = [row("<image>What colour?", [png_bytes(red())]), row("<image><image>Two?", [png_bytes(red())]),
            row("No placeholder", [png_bytes(red())])]
    write_parquet(rows[:2], tmp_path / "two.parquet")
    with pytest.raises(ValueError, match=r"two.parquet: row 2: the prompt has 2 <image> placeholder\(s\) but "
                                         r"'images' holds 1 image\(s\)"):
        load_rl_parquet(tmp_path / "two.parquet")
    with pytest.raises(ValueError, match=r"f: row 3: the prompt has 0 <image>"):
        images_of(rows[2], "f: row 3")
    with pytest.raises(ValueError, match=r"f: row 9: the prompt has 1 <image> placeholder\(s\) but 'images' holds 0"):
        images_of(row("<image>?", None), "f: row 9")
    with pytest.raises(ValueError, match=r"f: row 4: image 1: cannot decode the image"):
        images_of(row("<image>?", [{"bytes": b"not a png"}]), "f: row 4")


def test_parquet_rows_come_back_with_decoded_images_and_text_rows_without(tmp_path):
    write_parquet([row("<image>What colour?", [png_bytes(red(5))])], tmp_path / "a.parquet")
    got = load_rl_parquet(tmp_path / "a.parquet")[0]
    assert got["images"][0].size == (5, 5) and got["images"][0].getpixel((2, 2)) == (255, 0, 0)
    text = {k: v for k, v in row("no image here", None).items() if k != "images"}
    write_parquet([text], tmp_path / "b.parquet")
    assert "images" not in load_rl_parquet(tmp_path / "b.parquet")[0]


def test_chat_content_splits_text_at_placeholders():
    chat = [{"role": "system", "content": "Look."}, {"role": "user", "content": "<image>Colour of <image>? ok"}]
    assert chat_content(chat) == [{"role": "system", "content": "Look."},
                                  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour of "},
                                                               {"type": "image"}, {"type": "text", "text": "? ok"}]}]
