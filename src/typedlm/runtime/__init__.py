"""The model runtime: token ids in, answer-group masses out. Never handles strings.

- `models`: load a hub id, a local directory, a GGUF file or the embedded default;
- `hf`: the one adapter that touches transformers' internals (attention registry, cache, config fields);
- `features`: CUDA graphs, fused kernels and the attention kernel, resolved once at load;
- `patching`: swaps fused operations into a model where they agree with its own;
- `budget`: the memory one forward may hold, estimated from its shape before it runs;
- `kv`, `prefix_cache`: a prefix's keys/values and the byte-bounded cache of them across requests;
- `packing`: every question's suffix and label tree laid out in one sequence;
- `forwards`, `graphs`: the forward strategies (two forwards, one eager forward, one static forward
  replayed as a CUDA graph), chosen once by `engine`;
- `interface`: what the decider needs from an engine; `fake`: a deterministic fake model behind it, for tests.
"""
