"""typedlm's benchmarks: one module per benchmark, run from the repository root as `python -m benchmarks.NAME`.

`benchmarks.harness` holds what they share (options, models, inputs, the served path, the report); results go to
`benchmarks/results/NAME/DATE[-label].json`; benchmarks/README.md lists them, docs/performance.md has the figures.
They are not tests.
"""
