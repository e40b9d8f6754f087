"""A document's ids from its words' remembered ids: the same ids and spans as the tokenizer's own, for byte-level
BPE split as GPT-2 splits (the embedded tokenizer) and as Qwen splits (a tokenizer trained here), on ASCII text and
on text with the characters beyond ASCII that are admitted (others, and tokens inside a character, go to pieces)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from typedlm.core.questions import NoulQuestion
from typedlm.text.pieces import PROBE, PieceTokenizer
from typedlm.text.prompt import ChatLayout
from typedlm.text.words import WordTokenizer

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# ASCII words, contractions in both cases, digits, runs of spaces and line breaks, punctuation and control bytes
# (some missing from a vocabulary: BPE without a fallback drops them), next to each other in any order
WORDS = ["the", "Parcel", "refund", "IT'S", "we'll", "x", "snake_case", "1042", "3.14", "<b>", "--", "'", "\x04"]
GAPS = [" ", "  ", "\n", "\r\n", "\n\n  ", "\t", ", ", ". ", "", " \n ", "   ", "\x0b", "\x1c"]
texts = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(GAPS)), min_size=1, max_size=120).map(
    lambda parts: "".join(word + gap for word, gap in parts)
)
# the same with words beyond ASCII: admitted ones (accents, signs, typographic quotes and dashes, a no-break space)
# and some that never are (CJK, an emoji, a combining accent), which send the whole text to the pieces
WIDE = [*WORDS, "café", "£5", "it’s", "—", "“Zoë”", "naïve", "\u00a0", "€", "…", "São", "ß", "×÷", "µ", "¿Qué?", "½"]
RARE = ["東京", "🙂", "e\u0301"]
wide_texts = st.lists(
    st.tuples(st.sampled_from(WIDE + RARE) | st.sampled_from(WIDE), st.sampled_from(GAPS)), min_size=1, max_size=120
).map(lambda parts: "".join(word + gap for word, gap in parts))
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def qwen_style():
    """A byte-level BPE trained here, split by Qwen's regular expression then mapped to bytes, NFC-normalized."""
    model = Tokenizer(models.BPE())
    model.normalizer = normalizers.NFC()
    model.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    corpus = [PROBE, "The customer writes about a refund and the parcel, order 1042.\n\n  It's late!"] * 50
    corpus += ["£5 for the café — it’s “Zoë’s” naïve €10 order… São Paulo, µ × ß"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    model.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=model)


@pytest.fixture(scope="module")
def embedded_words(tokenizer):
    words = WordTokenizer.of(tokenizer, PieceTokenizer(tokenizer))
    assert words is not None
    return words


@pytest.fixture(scope="module")
def qwen_words(qwen_style):
    words = WordTokenizer.of(qwen_style, PieceTokenizer(qwen_style))
    assert words is not None
    return words


def assert_own(words: WordTokenizer, tokenizer, text: str) -> None:
    encoded = words.encode(text)
    own = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    assert encoded.ids == tuple(own["input_ids"])
    assert [encoded.start(i) for i in range(len(encoded.ids))] == [start for start, _ in own["offset_mapping"]]


@SETTINGS
@given(text=texts)
def test_the_embedded_tokenizers_words_give_its_own_ids_and_spans(embedded_words, tokenizer, text):
    assert_own(embedded_words, tokenizer, text)
    assert_own(embedded_words, tokenizer, f"<|im_start|>user\n{text}<|im_end|>")


@SETTINGS
@given(text=texts)
def test_a_qwen_style_tokenizers_words_give_its_own_ids_and_spans(qwen_words, qwen_style, text):
    assert_own(qwen_words, qwen_style, text)
    assert_own(qwen_words, qwen_style, f"<|im_start|>{text}<|im_end|>\n")


@SETTINGS
@given(text=wide_texts)
def test_words_beyond_ascii_give_the_tokenizers_own_ids_and_spans(
    embedded_words, tokenizer, qwen_words, qwen_style, text
):
    assert_own(embedded_words, tokenizer, text)
    assert_own(qwen_words, qwen_style, f"<|im_start|>{text}<|im_end|>\n")


def test_admitted_characters_are_read_from_words_and_the_others_go_to_the_pieces(tokenizer):
    words = WordTokenizer.of(tokenizer, PieceTokenizer(tokenizer, piece_chars=64))
    assert {"£", "é", "µ", "’", "—", "“", "€", "…"} <= set(words.extra_chars)
    assert "ä" not in words.extra_chars  # "aä" is "a", "Ã", "¤" here: a token would start inside the character
    before = words.words_texts
    assert_own(words, tokenizer, "The £5 refund for the café order — “late” again… 3 µm’s worth " * 30)
    assert words.words_texts == before + 1
    assert_own(words, tokenizer, "Mädchen " * 40)
    assert words.words_texts == before + 1
    # a normalizer that changes a character keeps it out (NFKC: µ, the micro sign, becomes μ, the Greek letter)
    nfkc = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()))
    nfkc.backend_tokenizer.normalizer = normalizers.NFKC()
    nfkc_words = WordTokenizer.of(nfkc, PieceTokenizer(nfkc))
    assert "µ" not in nfkc_words.extra_chars and "£" in nfkc_words.extra_chars
    assert_own(nfkc_words, nfkc, "3 µm for £5, " * 40)


def test_characters_never_admitted_and_bytes_the_vocabulary_drops_go_to_the_pieces(tokenizer):
    words = WordTokenizer.of(tokenizer, PieceTokenizer(tokenizer, piece_chars=64))
    for text in ["naïve café, 東京 🙂 " * 30, "a\x04b " * 50]:  # the embedded vocabulary has no \x04
        before = words.words_texts
        assert_own(words, tokenizer, text)
        assert words.words_texts == before
    assert_own(words, tokenizer, "plain words " * 50)
    assert words.words_texts == before + 1


def test_tokenizers_of_another_pipeline_are_not_taken(tokenizer, sentencepiece_tokenizer):
    assert WordTokenizer.of(sentencepiece_tokenizer, PieceTokenizer(sentencepiece_tokenizer)) is None  # no bytes
    lowered = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()))
    lowered.backend_tokenizer.normalizer = normalizers.Lowercase()  # changes ASCII text: not the same pipeline
    assert WordTokenizer.of(lowered, PieceTokenizer(lowered)) is None


def test_a_layout_from_words_gives_the_prompts_of_one_without(tokenizer):
    fast, plain = ChatLayout(tokenizer), ChatLayout(tokenizer, words=False)
    assert fast.words is not None and plain.words is None
    questions = [NoulQuestion("Is it late?"), NoulQuestion("Does the customer ask for money back?")]
    states = ["the parcel is late " * 50, "Ticket 7.\n" + "the box was broken, refund it. " * 40, "word", "café " * 9]
    for state in states:
        got, want = fast.tokenize(state, questions), plain.tokenize(state, questions)
        assert (got.prefix_ids, got.suffix_ids) == (want.prefix_ids, want.suffix_ids)
        assert fast.cut_holds(state)
    assert fast.words.words_texts == 4
