"""The decider facade: state + questions → answers, using the text layer, the runtime and calibration.

- `decider`: `Decider`, the one object callers hold (load, decide, respond, read, answer);
- `reads`: every read of a question (its option order rotated) and mapping them back;
- `calibration`: raw / contextual / fitted calibration of one read, averaging reads, calibration files.
"""
