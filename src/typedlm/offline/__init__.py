"""Offline work over labeled data: corpora from PyPI packages (`evaldata`, with the newer sets' loaders in
`corpora`), metrics and reliability diagrams (`metrics`), evaluation through a decider or a server (`evaluate`),
and fitting calibration files (`fitting`).

`evaldata`, `corpora` and `metrics` are plain data (no torch); `evaluate` and `fitting` drive a decider passed in.
"""
