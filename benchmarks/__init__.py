"""`make bench`: speed and quality figures, printed and recorded in docs/benchmarks.md."""
