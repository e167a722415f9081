"""`deepinfer bench`: one protocol (docs/bench/protocol.md), many backends.

protocol.py  the verbatim productivity protocol and the synthetic prompts of exact token counts
speed.py     the speed runs (decode, prefill, combined, long context, concurrency, memory)
targets.py   in-process engine target; targets_http.py: OpenAI-compatible and Ollama endpoints
stats.py     medians and percentiles; envinfo.py: device, versions, commit, command line
report.py    Markdown + PNG plots from a results JSON; readme_table.py: README performance table
cli.py       the command (also `python -m engine.bench.cli`)
"""
