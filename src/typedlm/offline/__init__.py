"""Offline work over labeled data: corpora from PyPI packages (`evaldata`), metrics and reliability diagrams
(`metrics`), evaluation through a decider or a server (`evaluate`), and fitting calibration files (`fitting`).

`evaldata` and `metrics` are plain data (no torch); `evaluate` and `fitting` drive a decider passed in.
"""
