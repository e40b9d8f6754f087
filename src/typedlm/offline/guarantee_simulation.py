"""The guarantees a team is given, checked by a simulated user on recorded readouts (no model run), counted per
independent draw of labels: a guarantee is a statement about the share of draws whose sets under-cover or whose
certificate is wrong, not about a mean pooled over draws.

For each labeled set S, as a new user's task (as `offline.simulation`: the default fitted leave-one-set-out), and
for each K:
1. draws of K labels from S's train split (`draws`): "disjoint", a seeded order of the split cut into ⌊n/K⌋ draws
   that share no label (independent, but few: 4 of 100 from 400); "random", `RANDOM_DRAWS` draws each a fresh
   random K of the split (independent draws from the split, overlapping one another as draws from one population
   do);
2. each draw posted as fair labels to a fresh served model (`typedlm.calibrate.out_of_fold.OutOfFold`, as a server
   learns them: fold learners and, where the readouts were recorded with features and `readouts` is asked, their
   learned readouts), then every held-out answer of S answered by it, with its set at coverage 1 − α and its
   abstention at each target accuracy (`typedlm.calibrate.decisions`), exactly as a server serves them;
3. per draw: the realised coverage (the share of held-out answers whose set holds the gold one; and, beside it, of
   the train split's answers not drawn, which are drawn as the labels were where the held-out split may not be) and
   set size, the accuracy of the answers shown, and per target the answers committed and their accuracy. A draw
   under-covers where its coverage is below 1 − α − `UNDER`; its certificate is wrong where it commits at least
   `MIN_COMMITTED` held-out answers and they are right less than the target of the time (fewer committed: too few to
   judge, and counted apart).
Beside them, the baseline (split conformal on the default's probabilities with the same labels, pooled: what a team
gets without the learner or the levels), the theory's coverage for that many labels, and a drifted stream (`drift`):
one set's labels followed by another's, as one question family, to compare split conformal and the online variant's
miss rate after the switch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from typedlm.calibrate.decisions import Decisions
from typedlm.calibrate.guarantees import answer_set, online_run, quantile_rank, split_misses, split_quantile
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.calibrate.projection import decode
from typedlm.core.questions import Question
from typedlm.offline.readouts import Readout
from typedlm.offline.simulation import ShippedVariant, defaults, labeled_sets, samples_of

KS = (50, 100, 200)
RANDOM_DRAWS = 40
ALPHA = 0.1
TARGETS = (0.9, 0.95)  # selective answers measured at these accuracies
MIN_COMMITTED = 20  # a draw's certificate is judged where it commits at least this many held-out answers
UNDER = 0.03  # a draw under-covers where its sets cover below 1 − α − this
DRAW_KINDS = ("disjoint", "random")


def beta_moments(n: int, alpha: float) -> tuple[float, float] | None:
    """The mean and standard deviation of split conformal's coverage given n labels: Beta(k, n + 1 − k)."""
    k = quantile_rank(n, alpha)
    if k is None:
        return None
    a, b = k, n + 1 - k
    return a / (a + b), math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))


def draws(n: int, k: int, random_draws: int = RANDOM_DRAWS, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Draws of k of n train answers (see the module): "disjoint" and "random"."""
    order = np.random.default_rng(seed).permutation(n)
    disjoint = [order[i * k : (i + 1) * k] for i in range(n // k)]
    rngs = np.random.default_rng(seed + 1).spawn(random_draws)
    return {"disjoint": disjoint, "random": [rng.permutation(n)[:k] for rng in rngs]}


def _run(keys, train, held, features, draw, alpha, targets, readouts: bool) -> dict[str, Any]:
    """One draw posted, then every held-out answer served with its set and abstentions (see the module)."""
    folds = OutOfFold()
    folds.add(
        (position, keys["train"][i], train[i], features["train"][i] if readouts else None, True)
        for position, i in enumerate(draw)
    )
    folds.settle()
    decisions = Decisions(folds)
    base_q = split_quantile(np.asarray([1.0 - train[i].probs[train[i].gold] for i in draw]), alpha)
    covered, sizes, base_covered, base_sizes, right, labels = [], [], [], [], [], []
    online = 0  # answers whose set came from the online variant (the level's stream judged to have drifted)
    committed: dict[float, list[bool]] = {target: [] for target in targets}
    for i, (key, s) in enumerate(zip(keys["held_out"], held, strict=True)):
        served = folds.answer(
            key, key["kind"], s.probs, s.mass, s.disagreement, features["held_out"][i] if readouts else None
        )
        chosen = decisions.answer_set(key, served, 1 - alpha)
        covered.append(s.gold in chosen.answers)
        sizes.append(len(chosen.answers))
        labels.append(chosen.labels)
        online += chosen.guarantee == "long-run"
        baseline = answer_set(list(s.probs), base_q) or [int(np.argmax(s.probs))]  # the top answer always in
        base_covered.append(s.gold in baseline)
        base_sizes.append(len(baseline))
        top = int(np.argmax(served.probs))
        right.append(top == s.gold)
        for target in targets:
            if not decisions.selective(key, served.probs[top], target).abstain:
                committed[target].append(top == s.gold)
    selective = {}
    for target, rights in committed.items():
        judged = len(rights) >= MIN_COMMITTED
        selective[target] = {
            "committed": len(rights),
            "right": int(sum(rights)),
            "judged": judged,
            "wrong": judged and sum(rights) < target * len(rights),
        }
    # the train split's other answers: drawn as the labels were (exchangeable with them by construction), where
    # the held-out split may be drawn otherwise
    rest = np.setdiff1d(np.arange(len(train)), draw)
    rest_covered = []
    for i in rest:
        key, s = keys["train"][i], train[i]
        served = folds.answer(
            key, key["kind"], s.probs, s.mass, s.disagreement, features["train"][i] if readouts else None
        )
        rest_covered.append(s.gold in decisions.answer_set(key, served, 1 - alpha).answers)
    return {
        "coverage": float(np.mean(covered)),
        "coverage_rest": float(np.mean(rest_covered)) if rest_covered else None,
        "set_size": float(np.mean(sizes)),
        "labels_used": float(np.mean(labels)),
        "baseline_coverage": float(np.mean(base_covered)),
        "baseline_set_size": float(np.mean(base_sizes)),
        "accuracy": float(np.mean(right)),
        "online_share": online / len(held),
        "selective": selective,
    }


def _summary(runs: Sequence[dict[str, Any]], alpha: float, m: int, targets: Sequence[float]) -> dict[str, Any]:
    """A set of draws at one K: means, the share of draws under-covering, and per target the share of judged draws
    whose certificate is wrong."""
    coverage = np.asarray([r["coverage"] for r in runs])
    theory = beta_moments(round(float(np.mean([r["labels_used"] for r in runs]))), alpha)
    keys = ("coverage", "set_size", "labels_used", "baseline_coverage", "baseline_set_size", "accuracy")
    out: dict[str, Any] = {key: float(np.mean([r[key] for r in runs])) for key in keys}
    rest = np.asarray([r["coverage_rest"] for r in runs if r["coverage_rest"] is not None])
    out.update(
        draws=len(runs),
        coverage_rest=float(rest.mean()) if len(rest) else None,
        rest_under_share=float((rest < 1 - alpha - UNDER).mean()) if len(rest) else None,
        coverage_sd=float(coverage.std(ddof=1)) if len(runs) > 1 else 0.0,
        coverage_min=float(coverage.min()),
        under_covering=int((coverage < 1 - alpha - UNDER).sum()),
        under_share=float((coverage < 1 - alpha - UNDER).mean()),
        baseline_under_share=float((np.asarray([r["baseline_coverage"] for r in runs]) < 1 - alpha - UNDER).mean()),
        switched_draws=int(sum(r["online_share"] > 0 for r in runs)),
        theory_mean=theory[0] if theory else None,
        # the spread theory allows: the Beta law's and the held-out sample's own binomial noise
        theory_sd=math.sqrt(theory[1] ** 2 + theory[0] * (1 - theory[0]) / m) if theory else None,
    )
    selective = {}
    for target in targets:
        rows = [r["selective"][target] for r in runs]
        judged = [row for row in rows if row["judged"]]
        committed = sum(row["committed"] for row in rows)
        selective[str(target)] = {
            "automated_share": committed / (m * len(rows)),
            "committed_accuracy": sum(row["right"] for row in rows) / committed if committed else None,
            "draws_committing": sum(row["committed"] > 0 for row in rows),
            "judged_draws": len(judged),
            "wrong_draws": sum(row["wrong"] for row in judged),
            "wrong_share": sum(row["wrong"] for row in judged) / len(judged) if judged else None,
        }
    out["selective"] = selective
    return out


def _features(rows: Sequence[Readout]) -> list[np.ndarray | None]:
    return [None if r.features is None else decode(r.features) for r in rows]


def _cell(keys, train, held, features, k, random_draws, alpha, targets, models) -> dict[str, Any]:
    """One set at one K: every kind of draw, every model, summarised (a process pool's task)."""
    out = {}
    for kind, chosen in draws(len(train), k, random_draws).items():
        out[kind] = {
            model: _summary(
                [_run(keys, train, held, features, d, alpha, targets, model == "readouts") for d in chosen],
                alpha,
                len(held),
                targets,
            )
            for model in models
        }
    return out


def simulate_guarantees(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    questions: Mapping[str, Mapping[tuple[str, str], Question]],
    variants: Mapping[str, ShippedVariant],
    prompt_version: str,
    ks: Sequence[int] = KS,
    random_draws: int = RANDOM_DRAWS,
    alpha: float = ALPHA,
    targets: Sequence[float] = TARGETS,
    with_readouts: bool = False,
    jobs: int = 1,
) -> dict[str, Any]:
    """Per set, K, kind of draw and model ("calibration": the fold learners alone; "readouts", with
    `with_readouts` and features recorded: their readouts too): `_summary` of its draws (see the module), each set
    and K a task of a pool of `jobs` processes."""
    bases = {kind: v.base for kind, v in variants.items()}
    fitted = defaults(readouts, variants)
    report: dict[str, Any] = {}
    with ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        cells = {}
        for name, (keys, train, held) in labeled_sets(readouts, questions, fitted, bases, prompt_version):
            features = {split: _features(readouts[name][split]) for split in ("train", "held_out")}
            recorded = all(f is not None for split in features.values() for f in split)
            models = ("calibration", "readouts") if with_readouts and recorded else ("calibration",)
            report[name] = {"n_train": len(train), "n_held_out": len(held), "readouts": recorded, "K": {}}
            for k in ks:
                task = (keys, train, held, features, k, random_draws, alpha, tuple(targets), models)
                cells[(name, k)] = pool.submit(_cell, *task) if pool is not None else _cell(*task)
        for (name, k), cell in cells.items():
            report[name]["K"][k] = cell.result() if pool is not None else cell
    return report


def drift(
    readouts: Mapping[str, Mapping[str, Sequence[Readout]]],
    variants: Mapping[str, ShippedVariant],
    first: str,
    second: str,
    alpha: float = ALPHA,
    seeds: int = 20,
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
