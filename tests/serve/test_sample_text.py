"""A sample's text released token by token adds up to decoding the whole completion at once, shows no half
character, and never releases what a stop string will cut."""

import pytest
import torch

from serve.text import SampleText


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return tiny[1]


def release(tokenizer, ids: list[int], stop: list[str], finish_at: int | None = None) -> list[str]:
    """The text each token releases; the sample ends at token `finish_at` (default: the last)."""
    text = SampleText(tokenizer, stop)
    last = len(ids) - 1 if finish_at is None else finish_at
    return [text.add(token, finished=i == last) for i, token in enumerate(ids[: last + 1])]


@pytest.mark.parametrize("seed", range(4))
def test_random_tokens_released_one_by_one_decode_as_the_whole(tokenizer, seed):
    ids = torch.randint(0, len(tokenizer), (300,), generator=torch.Generator().manual_seed(seed)).tolist()
    assert "".join(release(tokenizer, ids, [])) == tokenizer.decode(ids, skip_special_tokens=True)


def test_characters_split_across_tokens_are_released_whole(tokenizer):
    text = "naïve café, 日本語の文章 🙂🚀 done"
    ids = tokenizer.encode(text)
    pieces = release(tokenizer, ids, [])
    assert len(ids) > len(text.split())  # the emoji and the kanji take several byte tokens each
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_text_that_may_begin_a_stop_string_is_held_until_it_cannot(tokenizer):
    text = "SELECT a FROM t; </sql> and then more"
    ids = tokenizer.encode(text)
    # the engine ends the sample at the token that completes the stop string
    finish_at = next(k for k in range(len(ids)) if "</sql>" in tokenizer.decode(ids[: k + 1]))
    pieces = release(tokenizer, ids, ["</sql>", "never"], finish_at)
    released = ""
    for piece in pieces:  # without the hold, "</" would go out before "sql>" comes
        released += piece
        assert "SELECT a FROM t; ".startswith(released)
    assert released == "SELECT a FROM t; "


def test_a_sample_that_ends_without_its_stop_string_releases_everything(tokenizer):
    ids = tokenizer.encode("no stop here </sq")
    assert "".join(release(tokenizer, ids, ["</sql>"])) == "no stop here </sq"
