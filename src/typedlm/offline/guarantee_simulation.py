"""The guarantees a team is given, checked by a simulated user on recorded readouts (no model run).

For each labeled set S, as a new user's task (as `offline.simulation`: the default fitted leave-one-set-out):
1. S's train answers in a seeded random order; the first K are posted as fair labels: learned by the server's
   learner, and scored out of fold (`typedlm.calibrate.out_of_fold`), as a server does;
2. every held-out answer through the learner, its answer set at coverage 1 − α (`typedlm.calibrate.decisions`) and
   whether it abstains at a target accuracy;
3. measured: the realised coverage (the share of held-out answers whose set holds the gold one) per order, its mean
   and spread beside what split conformal's theory says for that many labels (the coverage given the labels is
   Beta(k, n + 1 − k), k = ⌈(n+1)(1−α)⌉, plus the held-out sample's own binomial noise), the mean set size beside
   a baseline (the same split conformal on the default's probabilities, with the same labels: what a user gets
   without the learner), and the committed answers' accuracy and share.
Beside it, a drifted stream (`drift`): one set's labels followed by another's, as one question family, scored under
the default, to compare split conformal and the online variant's miss rate after the switch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from typedlm.calibrate.decisions import Decisions
from typedlm.calibrate.guarantees import answer_set, online_run, quantile_rank, split_misses, split_quantile
from typedlm.calibrate.learning import Learner
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.core.questions import Question
from typedlm.offline.readouts import Readout
from typedlm.offline.simulation import ShippedVariant, defaults, labeled_sets, samples_of

KS = (25, 50, 100, 200)
SEEDS = 20
ALPHA = 0.1
TARGET_ACCURACY = 0.9
ALSO_TARGETS = (0.95,)  # selective answers measured at these accuracies too
MIN_COMMITTED = 20  # the selective target is judged on sets that commit at least this many held-out answers


def beta_moments(n: int, alpha: float) -> tuple[float, float] | None:
    """The mean and standard deviation of split conformal's coverage given n labels: Beta(k, n + 1 − k)."""
    k = quantile_rank(n, alpha)
    if k is None:
        return None
    a, b = k, n + 1 - k
    return a / (a + b), math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))


def _run(keys, train, held, order, alpha, target, also=()) -> dict[str, Any]:
    """One stream order: K labels posted, the held-out answers' sets and abstentions."""
    learner, folds = Learner(), OutOfFold()
    labeled = [(keys["train"][i], train[i]) for i in order]
    learner.add(labeled)
    folds.add((position, key, sample, True) for position, (key, sample) in enumerate(labeled))
    decisions = Decisions(folds)
    base_q = split_quantile(np.asarray([1.0 - train[i].probs[train[i].gold] for i in order]), alpha)
    covered, sizes, base_covered, base_sizes, levels, committed, right = [], [], [], [], [], [], []
    online = 0  # answers whose set came from the online variant (the level's stream judged to have drifted)
    extra: dict[float, list[bool]] = {other: [] for other in also}  # committed answers' rightness at other targets
    for key, s in zip(keys["held_out"], held, strict=True):
        probs, _ = learner.calibrate(key, s.probs, s.mass, s.disagreement)
        chosen = decisions.answer_set(key, probs, s.probs, 1 - alpha)
        covered.append(s.gold in chosen.answers)
        sizes.append(len(chosen.answers))
        levels.append(chosen.labels)
        online += chosen.guarantee == "long-run"
        baseline = answer_set(list(s.probs), base_q)
        base_covered.append(s.gold in baseline)
        base_sizes.append(len(baseline))
        top = max(range(len(probs)), key=probs.__getitem__)
        if not decisions.selective(key, probs[top], target).abstain:
            committed.append(1)
            right.append(top == s.gold)
        for other in also:
            if not decisions.selective(key, probs[top], other).abstain:
                extra[other].append(top == s.gold)
    return {
        "coverage": float(np.mean(covered)),
        "set_size": float(np.mean(sizes)),
        "labels_used": float(np.mean(levels)),
        "baseline_coverage": float(np.mean(base_covered)),
        "baseline_set_size": float(np.mean(base_sizes)),
        "committed": float(len(committed)),
        "automated_share": len(committed) / len(held),
        "online_share": online / len(held),
        "committed_accuracy": float(np.mean(right)) if right else None,
        "also": {other: (len(rights), sum(rights)) for other, rights in extra.items()},
    }


def simulate_guarantees(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    questions: Mapping[str, Mapping[tuple[str, str], Question]],
    variants: Mapping[str, ShippedVariant],
    prompt_version: str,
    ks: Sequence[int] = KS,
    seeds: int = SEEDS,
    alpha: float = ALPHA,
    target: float = TARGET_ACCURACY,
    also: Sequence[float] = ALSO_TARGETS,
) -> dict[str, Any]:
    """Per set and K: the realised coverage over `seeds` orders (mean, spread, theory's), set sizes against the
    baseline, and the selective answers at `target` (and at each of `also`: `selective`) (see the module)."""
    bases = {kind: v.base for kind, v in variants.items()}
    fitted = defaults(readouts, variants)
    report: dict[str, Any] = {}
    for name, (keys, train, held) in labeled_sets(readouts, questions, fitted, bases, prompt_version):
        curve = {}
        for k in ks:
            runs = [
                _run(keys, train, held, np.random.default_rng(seed).permutation(len(train))[:k], alpha, target, also)
                for seed in range(seeds)
            ]
            coverage = np.asarray([r["coverage"] for r in runs])
            theory = beta_moments(round(float(np.mean([r["labels_used"] for r in runs]))), alpha)
            m = len(held)
            skip = ("committed_accuracy", "also")
            mean = {key: float(np.mean([r[key] for r in runs])) for key in runs[0] if key not in skip}
            accuracies = [r["committed_accuracy"] for r in runs if r["committed_accuracy"] is not None]
            # the committed answers' accuracy over every order's committed answers together
            right = sum(r["committed_accuracy"] * r["committed"] for r in runs if r["committed"])
            mean["committed_accuracy"] = right / sum(r["committed"] for r in runs) if accuracies else None
            curve[k] = {
                **mean,
                "coverage_sd": float(coverage.std(ddof=1)) if len(runs) > 1 else 0.0,
                "coverage_min": float(coverage.min()),
                "coverage_max": float(coverage.max()),
                "theory_mean": theory[0] if theory else None,
                # the spread theory allows: the Beta law's and the held-out sample's own binomial noise
                "theory_sd": math.sqrt(theory[1] ** 2 + theory[0] * (1 - theory[0]) / m) if theory else None,
                "selective": {
                    str(other): {
                        "automated_share": sum(r["also"][other][0] for r in runs) / (m * len(runs)),
                        "committed_accuracy": (
                            sum(r["also"][other][1] for r in runs) / sum(r["also"][other][0] for r in runs)
                            if any(r["also"][other][0] for r in runs)
                            else None
                        ),
                    }
                    for other in also
                },
            }
        report[name] = {"n_train": len(train), "n_held_out": len(held), "K": curve}
    return report


def drift(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    variants: Mapping[str, ShippedVariant],
    first: str,
    second: str,
    alpha: float = ALPHA,
    seeds: int = SEEDS,
) -> dict[str, Any]:
    """A stream of `first`'s train labels then `second`'s (one family, scored under the default), in seeded orders
    within each: split conformal's and the online variant's miss rate after the switch, and over all of it."""
    bases = {kind: v.base for kind, v in variants.items()}
    fitted = defaults(readouts, variants)
    streams = {}
    for name in (first, second):
        samples = samples_of(readouts[name]["train"], fitted[name]["train"], bases, 1)
        streams[name] = np.asarray([1.0 - s.probs[s.gold] for s in samples])
    rows = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        a, b = rng.permutation(streams[first]), rng.permutation(streams[second])
        scores = np.concatenate([a, b]).tolist()
        _, online = online_run(scores, alpha)
        split = split_misses(scores, alpha)
        rows.append(
            {
                "split_after": float(split[len(a) :].mean()),
                "online_after": float(online[len(a) :].mean()),
                "split_all": float(split.mean()),
                "online_all": float(online.mean()),
            }
        )
    return {
        "first": first,
        "second": second,
        "labels": [len(streams[first]), len(streams[second])],
        "alpha": alpha,
        **{key: float(np.mean([r[key] for r in rows])) for key in rows[0]},
    }
