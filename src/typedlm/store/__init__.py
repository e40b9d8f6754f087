"""Embedded storage, standard library only: the feedback store (`feedback`), one SQLite file per model fingerprint
holding every labeled answer users posted with what the model read (label masses, priors, label lengths), so that
calibration can be refitted later without running the model. Several processes (server replicas) may write one
file at once. Imports only `typedlm.core`; no torch, no numpy, no FastAPI.
"""
