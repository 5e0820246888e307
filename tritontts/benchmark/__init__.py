"""Benchmarks of the served stack, for every family: `python -m tritontts.benchmark`.

  load.py    streaming clients through the OpenAI front: time to first audio, real-time
             factor, throughput, gaps and underruns per concurrency level
  perf.py    perf_analyzer on each ensemble and on each stage, fed a real request's tensors
  report.py  results.json, report.md, PNG plots
"""
