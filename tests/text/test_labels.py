"""Labels: prefix-free groups, verified against the real tokenizer in context."""

from __future__ import annotations

import pytest

from typedlm.core.errors import ModelError
from typedlm.text.labels import MAX_NAME_CHARS, Labeler, LabelSet, choice_labels, score_labels, tree_fits
from typedlm.text.prompt import ChatLayout


@pytest.fixture(scope="module")
def labeler(tokenizer):
    return Labeler(tokenizer, ChatLayout(tokenizer).answer_opening)


def test_label_strings():
    assert choice_labels(3) == ["A", "B", "C"]
    assert choice_labels(26)[-1] == "Z"
    two = choice_labels(255)
    assert two[:2] == ["AA", "AB"] and len(set(two)) == 255 and all(len(label) == 2 for label in two)
    assert score_labels(4) == ["0", "1", "2", "3"]


def test_same_group_extensions_are_dropped_and_cross_group_prefixes_rejected():
    labels = LabelSet.build([[(1,), (1, 2), (3, 4)], [(5,), (5,)]])
    assert labels.groups == (((1,), (3, 4)), ((5,),))
    assert labels.inner_nodes == ((3,),)
    with pytest.raises(ModelError, match="overlap"):
        LabelSet.build([[(1,)], [(1, 2)]])
    with pytest.raises(ModelError, match="overlap"):
        LabelSet.build([[(7,)], [(7,)]])


def test_noul_groups_cover_every_surface_form(labeler, tokenizer):
    yes, no = labeler.labels("noul", 2).groups
    decoded_yes = {tokenizer.decode(list(form)) for form in yes}
    decoded_no = {tokenizer.decode(list(form)) for form in no}
    assert {"yes", "Yes", "y", "Y"} <= decoded_yes and {"no", "No", "NO", "n", "N"} <= decoded_no
    # "YES" is Y+ES in this tokenizer: its mass is already inside "Y", so it is not counted twice
    if len(tokenizer("YES", add_special_tokens=False)["input_ids"]) > 1:
        assert "YES" not in decoded_yes


@pytest.mark.parametrize("n", [2, 26, 27, 255])
def test_choice_labels_round_trip_in_context(labeler, tokenizer, n):
    opening = labeler._context
    opening_ids = tokenizer(opening, add_special_tokens=False)["input_ids"]
    labels = labeler.labels("choice", n)
    assert len(labels.groups) == n
    for label, (form,) in zip(choice_labels(n), labels.groups, strict=True):
        assert tokenizer.decode(list(form)) == label
        assert tokenizer(opening + label, add_special_tokens=False)["input_ids"] == opening_ids + list(form)


def test_score_labels_are_single_digits(labeler):
    assert all(len(form) == 1 for (form,) in labeler.labels("score", 10).groups)


def test_a_label_that_merges_with_its_context_is_not_readable(tokenizer):
    labeler = Labeler(tokenizer, "assist")
    assert labeler.encode("ant") is None  # "assistant" is one token: "ant" can never follow as written
    with pytest.raises(ModelError, match="none of the labels"):
        labeler.label_set([["ant"], ["B"]])


def test_options_read_by_name_are_their_names_in_context(labeler, tokenizer):
    names = ("billing", "shipping", "technical support", "ünïcode 名前")
    assert labeler.can_name(names)
    labels = labeler.names(names)
    for name, (form,) in zip(names, labels.groups, strict=True):
        assert tokenizer.decode(list(form)) == name
    assert labeler.names(names) is labels, "remembered per tuple of names"


def test_names_that_begin_one_another_or_grow_too_long_are_read_by_letter(labeler):
    # the tokens of "billing" begin those of "billing address": the shorter's mass would hold the longer's
    (short,), (long,) = labeler.names(("billing",)).groups[0], labeler.names(("billing address",)).groups[0]
    assert long[: len(short)] == short
    assert not labeler.can_name(("billing", "billing address"))
    assert not labeler.can_name(("ok", "ok"))
    long = tuple(f"option number {i} with a long and winding name, {i} times over" for i in range(20))
    assert not labeler.can_name(long), "the label tree would exceed MAX_NAME_NODES tokens"


def test_long_option_names_cost_what_they_hold_and_leave_bounded_memory(labeler):
    # A name of thousands of tokens has as many label-tree prefixes, each as long as its place: built and kept, one
    # 30,000-character name held about 300 MB. A name past MAX_NAME_CHARS is not tokenized at all; shorter ones
    # only until the tree outgrows MAX_NAME_NODES; and what is remembered counts its bytes.
    words = [f"w{i}" for i in range(8_000)]
    huge = (" ".join(words[:6_000]), " ".join(words[1:6_001]))  # ~40,000 characters each
    before = labeler.named.nbytes
    assert not labeler.can_name(huge)
    assert labeler.named.nbytes - before < 200_000, "only the names are kept, with the answer that they cannot be read"
    near = tuple(" ".join(words[k : k + MAX_NAME_CHARS // 6]) for k in range(3))  # under the characters' bound
    assert all(len(name) <= MAX_NAME_CHARS for name in near) and not labeler.can_name(near)
    with pytest.raises(ModelError, match="cannot be read by their names"):
        labeler.names(near)


def test_a_label_tree_is_counted_only_until_it_outgrows_its_bound():
    # forms of a million tokens: counting every prefix would take hours; the count stops at the bound
    assert not tree_fits([tuple(range(1_000_000))], 128)
    assert not tree_fits(((3, k, k + 1) for k in range(10**12)), 128)  # stops after the first 128 forms
    assert tree_fits([(1,) * 129], 128) and not tree_fits([(1,) * 130], 128)
    assert tree_fits([(1, 2, 3), (1, 2, 4), (5,)], 2)  # inner nodes (1,), (1, 2): shared prefixes count once
