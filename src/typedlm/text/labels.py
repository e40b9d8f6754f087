"""Answer labels: the strings a model says for each answer, and their token ids in context.

An answer is a *group* of surface forms (noul yes: yes/Yes/YES/y/Y); its probability is the total
mass on the group. A form is scored as its complete token sequence, so multi-token labels (two-letter
choice labels, "YES" as Y+ES) are exact. For the sum to be a probability, the forms must be
prefix-free across groups: if one answer's form were a prefix of another's, the shorter form's mass
would already include the longer one. Within a group a form that extends another form of the same
group is dropped for the same reason (its mass is already counted). A `LabelSet` is checked for all
of this when it is built; `Labeler` builds them from a tokenizer, in context, and caches them.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, cached_property
from itertools import product
from typing import Any

from typedlm.core.bounded import BoundedCache, ids_bytes, texts_bytes
from typedlm.core.errors import ModelError
from typedlm.core.names import Kind
from typedlm.core.questions import MAX_CHARS_PER_TOKEN, Question

TokenSeq = tuple[int, ...]

NOUL_FORMS = (("yes", "Yes", "YES", "y", "Y"), ("no", "No", "NO", "n", "N"))  # [yes, no]: see core.questions.YES


def choice_labels(n: int) -> list[str]:
    """A..Z for up to 26 options, else two-letter labels AA, AB, ... (equal length keeps them prefix-free)."""
    letters = string.ascii_uppercase
    if n <= len(letters):
        return list(letters[:n])
    labels = ["".join(pair) for pair in product(letters, repeat=2)]
    assert n <= len(labels), f"{n} options exceed the {len(labels)} two-letter labels"
    return labels[:n]


MAX_NAME_NODES = 128  # label-tree tokens a choice read by option names may take (else it is read by letters)
MAX_NAME_CHARS = (MAX_NAME_NODES + 1) * MAX_CHARS_PER_TOKEN  # a longer option name cannot be read by name
NAMED_LABEL_BYTES = 16 << 20  # option-name label sets remembered per labeler (their names and token ids)


def score_labels(n: int) -> list[str]:
    """Level i is labelled by its number; single digits keep the labels prefix-free."""
    assert n <= 10, "score labels are single digits"
    return [str(i) for i in range(n)]


# each question kind's surface forms, one group per answer, for n answers
LABEL_FORMS = {
    Kind.NOUL: lambda n: NOUL_FORMS,
    Kind.CHOICE: lambda n: [[label] for label in choice_labels(n)],
    Kind.SCORE: lambda n: [[label] for label in score_labels(n)],
}


def _is_prefix(short: TokenSeq, long: TokenSeq) -> bool:
    return len(short) <= len(long) and long[: len(short)] == short


def tree_fits(forms: Iterable[TokenSeq], max_nodes: int) -> bool:
    """Whether the forms' proper non-empty prefixes (a label tree's inner nodes) number at most `max_nodes`;
    stops as soon as they do not, so its cost is bounded by `max_nodes`, not by the forms' lengths."""
    nodes: set[TokenSeq] = set()
    for form in forms:
        if len(form) - 1 > max_nodes:
            return False
        for k in range(1, len(form)):
            nodes.add(form[:k])
        if len(nodes) > max_nodes:
            return False
    return True


@dataclass(frozen=True)
class LabelSet:
    """Token-level answers: `groups[i]` holds the token sequences of answer i's surface forms."""

    groups: tuple[tuple[TokenSeq, ...], ...]

    @classmethod
    def build(cls, groups: list[list[TokenSeq]]) -> LabelSet:
        """Dedupe, drop forms a shorter form of their own group already covers, check cross-group prefix-freedom."""
        kept: list[tuple[TokenSeq, ...]] = []
        for forms in groups:
            unique = sorted(set(forms), key=len)
            minimal: list[TokenSeq] = []
            for form in unique:
                assert form, "a label form has at least one token"
                if not any(_is_prefix(shorter, form) for shorter in minimal):
                    minimal.append(form)
            kept.append(tuple(minimal))
        for i, forms in enumerate(kept):
            for j, others in enumerate(kept):
                if i != j and any(_is_prefix(a, b) for a in forms for b in others):
                    raise ModelError(f"answer labels {i} and {j} overlap in this tokenizer: {forms} vs {others}")
        return cls(tuple(kept))

    @cached_property
    def inner_nodes(self) -> tuple[TokenSeq, ...]:
        """Proper non-empty prefixes of the forms: the tree nodes fed to the model to score later tokens."""
        nodes = {form[:k] for forms in self.groups for form in forms for k in range(1, len(form))}
        return tuple(sorted(nodes, key=lambda node: (len(node), node)))

    @cached_property
    def max_depth(self) -> int:
        return max(len(form) for forms in self.groups for form in forms)


_UNKNOWN = object()  # names not looked at yet (None: looked at, and cannot be read by name)


class Labeler:
    """Encodes labels as the model would emit them after `context` (the assistant turn opening)."""

    def __init__(self, tokenizer, context: str):
        self._tokenizer = tokenizer
        self._context = context
        self._context_ids = self._encode(context)
        # option names -> their label set, or None where they cannot be read by name
        self.named: BoundedCache[tuple[str, ...], Any] = BoundedCache("option_names", NAMED_LABEL_BYTES)

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, label: str) -> TokenSeq | None:
        """The label's token ids right after the context, or None where the context/label boundary is unstable."""
        ids = self._encode(self._context + label)
        n = len(self._context_ids)
        if ids[:n] != self._context_ids or len(ids) == n:
            return None  # the label merges with the context: the model cannot emit it as written
        label_ids = tuple(ids[n:])
        if self._tokenizer.decode(list(label_ids)) != label:
            return None
        return label_ids

    def label_set(self, groups: list[list[str]] | tuple[tuple[str, ...], ...]) -> LabelSet:
        token_groups = []
        for forms in groups:
            encoded = [ids for ids in map(self.encode, forms) if ids is not None]
            if not encoded:
                raise ModelError(f"none of the labels {list(forms)} can be read with this tokenizer")
            token_groups.append(encoded)
        return LabelSet.build(token_groups)

    @cache  # noqa: B019 - a Labeler lives as long as its model
    def labels(self, kind: Kind, n: int) -> LabelSet:
        """The label set of a question of `kind` with `n` answers, built once per kind and size."""
        return self.label_set(LABEL_FORMS[kind](n))

    def for_question(self, question: Question) -> LabelSet:
        """The labels a question is answered by: its options' names where it is read by name, else letters,
        level numbers or yes/no by its kind and size."""
        if getattr(question, "by_name", False):
            return self.names(tuple(name for name, _ in question.options))
        return self.labels(question.kind, question.size)

    def names(self, names: tuple[str, ...]) -> LabelSet:
        """The label set of options answered by their names: one form per option, the name exactly as written.

        Raises:
            ModelError: the names cannot be read by name (see `can_name`).
        """
        labels = self._named_labels(names)
        if labels is None:
            raise ModelError(f"options {list(names)[:4]}... cannot be read by their names with this tokenizer")
        return labels

    def can_name(self, names: tuple[str, ...]) -> bool:
        """Whether options with these names can be read by name: every name encodes as itself after the context,
        no name's tokens begin another's, and the label tree stays within MAX_NAME_NODES tokens. A name longer
        than MAX_NAME_CHARS is not tokenized at all, and the tree is counted only until it outgrows its bound: the
        cost is linear in the names' length and bounded whatever they hold."""
        return self._named_labels(names) is not None

    def _named_labels(self, names: tuple[str, ...]) -> LabelSet | None:
        found = self.named.get(names, _UNKNOWN)
        if found is not _UNKNOWN:
            return found
        labels = self._read_names(names)
        size = texts_bytes(names) + (sum(ids_bytes(form) for forms in labels.groups for form in forms) if labels else 0)
        return self.named.put(names, labels, size)

    def _read_names(self, names: tuple[str, ...]) -> LabelSet | None:
        if any(len(name) > MAX_NAME_CHARS for name in names):
            return None
        forms = [self.encode(name) for name in names]  # as much text as the prompt holds, tokenized once more
        if any(form is None for form in forms) or not tree_fits(forms, MAX_NAME_NODES):
            return None
        try:
            labels = LabelSet.build([[form] for form in forms])
        except ModelError:  # one name's tokens begin another's
            return None
        return labels if all(len(group) == 1 for group in labels.groups) else None

    def verify(self, max_options: int, max_levels: int) -> None:
        """Build the largest label sets once, so a tokenizer that cannot serve them fails at load time."""
        self.labels(Kind.NOUL, 2)
        self.labels(Kind.CHOICE, min(max_options, 26))
        self.labels(Kind.CHOICE, max_options)
        self.labels(Kind.SCORE, max_levels)
