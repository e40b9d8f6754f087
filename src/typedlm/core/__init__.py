"""Plain data: questions, answers, errors, confidence formulas and the engine's feature switches.

Everything here is standard-library Python: no torch, no transformers, no FastAPI. Every other layer
speaks in these types; the HTTP server imports nothing else.
"""
