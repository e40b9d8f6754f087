"""A post of labels by answer id, stored from what the window of recent answers held (`recent`): no forward.

    stored, labels = post_by_id(feedback, recent.held(posted.answer_ids), posted)

Each label becomes what a post of its answer's state and questions stores (`Feedback.post` with the answer's
question, its reads and the gold answer's index), so the two are the same label. `Feedback.post` takes a post's
labels keyed by question id, one of each, and one way of sampling: a post by id that labels several answers of one
question (a family's suggestions), or answers sampled two ways (some handed out to teach), is stored as several
posts, in the body's order; the first takes the post's idempotency id (`x_feedback_id`) and the n-th after it that
id with "#n", so that a retried post stores each of them once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from typedlm.calibrate.feedback import Feedback
from typedlm.core.errors import InvalidRequest
from typedlm.core.labeling import LabelsById
from typedlm.decide.recent import Held


def gold_indexes(answers: Sequence[Held], posted: LabelsById) -> list[int]:
    """Each label's gold answer as an index into its answer's probabilities.

    Raises:
        InvalidRequest: a gold answer that is not one of its answer's, or (a post that sent its questions too) an
            id that names an answer to another question than the one it is sent for; each named where it is.
    """
    golds = []
    for label, held in zip(posted.labels, answers, strict=True):
        if label.question_id is not None:
            sent = posted.fallback.request.questions[label.question_id]
            if sent != held.question:
                raise InvalidRequest("names the answer to another question", ("x_ids", label.question_id))
        try:
            golds.append(held.question.gold_index(label.gold))
        except ValueError as exc:
            raise InvalidRequest(f"a {held.kind} question's gold answer must be {exc}", label.loc) from None
    return golds


def post_by_id(feedback: Feedback, answers: Sequence[Held], posted: LabelsById) -> tuple[int, dict[str, Any]]:
    """Store and learn `posted`'s labels of `answers` (its ids' answers, in order): the labels stored (0 where the
    post was stored before), and per answer id its question id, how its label was sampled and the calibration now
    in force for its question.

    Raises:
        InvalidRequest: as `gold_indexes` (before anything is stored).
        StoreError: the database cannot be written.
    """
    golds = gold_indexes(answers, posted)
    posts: dict[tuple[str, int], list[int]] = {}  # (sample, repeat of a question id) → the labels' positions
    repeats: Counter[tuple[str, str]] = Counter()
    for i, held in enumerate(answers):
        sample = held.sample(posted.sample)
        posts.setdefault((sample, repeats[sample, held.question_id]), []).append(i)
        repeats[sample, held.question_id] += 1
    stored, labels = 0, {}
    for n, ((sample, _), members) in enumerate(posts.items()):
        feedback_id = posted.feedback_id if n == 0 or posted.feedback_id is None else f"{posted.feedback_id}#{n}"
        questions = {answers[i].question_id: answers[i].question for i in members}
        reads = {answers[i].question_id: answers[i].reads() for i in members}
        gold = {answers[i].question_id: golds[i] for i in members}
        count, in_force = feedback.post(questions, reads, gold, feedback_id, sample)
        stored += count
        for i in members:
            qid = answers[i].question_id
            labels[posted.labels[i].answer_id] = {"question": qid, "sample": sample, "x_feedback": in_force[qid]}
    return stored, labels
