"""Text ↔ token ids, without a model: the prompt layout (chat template, question blocks, the token-level
prefix/suffix cut) and the answer labels (surface forms, their token ids in context, prefix-free label sets).

Needs a tokenizer, never a model; imports only `typedlm.core`.
"""
