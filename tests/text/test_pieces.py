"""A long text tokenized in pieces side by side: the same ids and spans as the text tokenized whole, or whole."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from typedlm.core.questions import NoulQuestion
from typedlm.text.pieces import PROBE, PieceTokenizer
from typedlm.text.prompt import ChatLayout

# Words, spaces, line breaks, punctuation and characters a byte-level token may start inside of, in any order: the
# texts put seams next to every kind of neighbour.
WORDS = ["the", "Parcel", "refund", "naïve", "東京", "🙂", "x", "snake_case", "1042", "it's", "—", "<b>", "é"]
GAPS = [" ", "  ", "\n", "\n\n", "\t", ", ", ". ", "", " \n ", "   "]
texts = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(GAPS)), min_size=1, max_size=120).map(
    lambda parts: "".join(word + gap for word, gap in parts)
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def whole(tokenizer, text: str) -> tuple[tuple[int, ...], list[int]]:
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return tuple(encoded["input_ids"]), [start for start, _ in encoded["offset_mapping"]]


def assert_whole(pieces: PieceTokenizer, tokenizer, text: str) -> None:
    encoded = pieces.encode(text)
    ids, starts = whole(tokenizer, text)
    assert encoded.ids == ids
    assert [encoded.start(i) for i in range(len(ids))] == starts


@SETTINGS
@given(text=texts)
def test_the_embedded_tokenizers_pieces_give_the_whole_texts_ids_and_spans(tokenizer, text):
    pieces = PieceTokenizer(tokenizer, piece_chars=16)  # many seams per text
    assert pieces.splits
    assert_whole(pieces, tokenizer, text)


@SETTINGS
@given(text=texts)
def test_a_sentencepiece_style_tokenizers_pieces_give_the_whole_texts_ids_and_spans(sentencepiece_tokenizer, text):
    pieces = PieceTokenizer(sentencepiece_tokenizer, piece_chars=16)
    assert pieces.splits  # `▁` marks a piece's first word as it marks any word after a space
    assert_whole(pieces, sentencepiece_tokenizer, text)


def test_ordinary_text_is_cut_and_every_seam_holds(tokenizer):
    pieces = PieceTokenizer(tokenizer, piece_chars=256)
    text = "\n".join(f"Message {i}: the customer writes about order {1000 + i}, late again." for i in range(60))
    encoded = pieces.encode(text)
    assert len(encoded.firsts) == len(pieces._seams(text)) + 1 > 10
    assert pieces.seams_failed == 0
    assert_whole(pieces, tokenizer, text)
    # short texts and texts without a word to cut before are tokenized whole
    for text in ("short text", "x" * 3000, "東京" * 2000):
        assert len(pieces.encode(text).firsts) == 1
        assert_whole(pieces, tokenizer, text)


def test_a_seam_inside_a_word_fails_its_check_and_the_text_is_tokenized_whole(tokenizer, monkeypatch):
    pieces = PieceTokenizer(tokenizer, piece_chars=256)
    text = "the customer asks for a refund " * 40
    inside = text.index("refund") + 3  # "ref|und": pieces tokenized alone give other ids than the whole
    monkeypatch.setattr(pieces, "_seams", lambda text: [inside])
    assert pieces._joined(text, [inside]).ids != whole(tokenizer, text)[0]
    assert_whole(pieces, tokenizer, text)
    assert pieces.seams_failed == 1


def _trained(pre_tokenizer) -> PreTrainedTokenizerFast:
    model = Tokenizer(models.BPE(unk_token="<unk>"))
    if pre_tokenizer is not None:
        model.pre_tokenizer = pre_tokenizer
    corpus = [PROBE, "The customer writes about a refund and the parcel."] * 50
    model.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")


@pytest.mark.parametrize(
    "pre_tokenizer",
    [None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)],
    ids=["merges across spaces", "marks every text's start"],
)
def test_a_tokenizer_whose_pieces_do_not_join_never_cuts(pre_tokenizer):
    tokenizer = _trained(pre_tokenizer)
    pieces = PieceTokenizer(tokenizer, piece_chars=16)
    assert not pieces.splits and not pieces.joins(PROBE)
    text = "The customer writes about a refund and the parcel. " * 20
    assert len(pieces.encode(text).firsts) == 1
    assert_whole(pieces, tokenizer, text)


def test_a_layout_cutting_documents_into_pieces_gives_the_whole_prompts(tokenizer):
    cut, uncut = ChatLayout(tokenizer, piece_chars=64), ChatLayout(tokenizer, piece_chars=0)
    assert cut.pieces.splits and not uncut.pieces.splits
    questions = [NoulQuestion("Is it late?"), NoulQuestion("Does the customer ask for money back?")]
    states = ["the parcel is late " * 50, "Ticket 7.\n" + "the box was broken, refund it. " * 40 + "\n", "word"]
    for state in states:
        prompt = cut.tokenize(state, questions)
        assert (prompt.prefix_ids, prompt.suffix_ids) == (
            uncut.tokenize(state, questions).prefix_ids,
            uncut.tokenize(state, questions).suffix_ids,
        )
        for question, suffix in zip(questions, prompt.suffix_ids, strict=True):
            assert prompt.prefix_ids + suffix == cut.encode(cut.prefix_text(state) + cut.suffix_text(question))
        assert cut.cut_holds(state)
    assert cut.pieces.seams_failed == 0
