"""Embedded storage, standard library only: the feedback store (`feedback`), one SQLite file per model fingerprint
holding every labeled answer users posted with what the model read (label masses, priors, label lengths), so that
calibration can be refitted later without running the model. Several processes (server replicas) may write one
file at once. The file itself, its tables and transactions, is `database`; a label and its row, `labels`. Imports
only `typedlm.core`; no torch, no numpy, no FastAPI.
"""
