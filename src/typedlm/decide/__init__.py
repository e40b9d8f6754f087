"""The decider facade: state + questions → answers, using the text layer, the runtime and calibration.

- `decider`: `Decider`, the one object callers hold (load, decide, respond, read, answer).
"""
