"""Calibration: label masses in, probabilities that mean what they say out. No model, no HTTP.

- `reads`: every read of a question (its option order rotated) and mapping reads back to its own order;
- `calibration`: the arithmetic of one read (raw, contextual, fitted), averaging reads, calibration files;
- `calibrators`: one object per method, each turning a question's reads into its answer;
- `learning`, `feedback`: what users' gold answers teach, learned online, and the calibrator built on it;
- `reliability`: ECE, its noise floor and reliability bins, shared by the feedback report and offline metrics.
"""
