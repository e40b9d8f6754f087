"""A handful of easy questions with known answers, to see what a model gets right and wrong.

    python examples/probe.py [--model MODEL]

Prints one line per question: the expected answer, the model's top answer with its probability,
and raw_mass (how much of the model's next-token mass landed on any answer label at all).
"""

from __future__ import annotations

import argparse

from typedlm import ChoiceQuestion, Decider, NoulAnswer, NoulQuestion, ScoreQuestion

PROBES = [
    ("The sky is blue on a clear day.", NoulQuestion("Is the sky blue?"), "yes"),
    ("The sky is blue on a clear day.", NoulQuestion("Is the sky green?"), "no"),
    ("Paris is the capital of France.", NoulQuestion("Is Paris the capital of France?"), "yes"),
    ("Paris is the capital of France.", NoulQuestion("Is Berlin the capital of France?"), "no"),
    ("", ChoiceQuestion((("hammer", None), ("apple", None), ("car", None)), "Which is a fruit?"), "apple"),
    ("", ChoiceQuestion((("dog", None), ("table", None), ("cloud", None)), "Which one is an animal?"), "dog"),
    (
        "I was charged twice and nobody answers my emails. This is unacceptable!",
        ChoiceQuestion((("angry", None), ("calm", None), ("excited", None)), "What is the tone?"),
        "angry",
    ),
    (
        "The server is down and all customers are affected right now.",
        ScoreQuestion(("can wait", "this week", "today", "immediately"), "How urgent is this?"),
        "3",
    ),
    (
        "Please update my newsletter preferences when you have time.",
        ScoreQuestion(("can wait", "this week", "today", "immediately"), "How urgent is this?"),
        "0",
    ),
]


def top(answer) -> tuple[str, float]:
    if isinstance(answer, NoulAnswer):
        return ("yes", answer.p_yes) if answer.p_yes >= 0.5 else ("no", 1 - answer.p_yes)
    if isinstance(answer.probabilities, dict):
        return answer.choice, answer.probabilities[answer.choice]
    best = max(range(len(answer.probabilities)), key=answer.probabilities.__getitem__)
    return str(best), answer.probabilities[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    decider = Decider.load(args.model, calibration="raw")  # the raw readout (README table)
    right = 0
    for state, question, expected in PROBES:
        answer = decider.decide(state or "(no document)", {"q": question}).answers["q"]
        label, p = top(answer)
        right += label == expected
        mark = "ok " if label == expected else "BAD"
        print(
            f"{mark} {question.instructions:<35} expected {expected:<6} got {label:<6} p={p:.3f} "
            f"raw_mass={answer.raw_mass:.3f}"
        )
    print(f"{right}/{len(PROBES)} right on {decider.name}")


if __name__ == "__main__":
    main()
