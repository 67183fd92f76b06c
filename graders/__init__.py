"""Graders for the fx-katas: a shared harness plus one small grader module per kata.

The packages, from the bottom up: frame (levels, checks, kata declarations, the catalogue), isolation
(the worker, its sandbox, records, the guard and the static scan), run (the session and the one run path),
katas (the kata graders), batch (grading in pytest subprocesses), learner, competition, dev, cli; the
command lines score.py, watch.py, scan.py and devcheck.py are thin entry points. Each package's
__init__ says what it may import; tests/test_layout.py holds every import to that.

May import: nothing of the graders (it only quiets a logger every package would otherwise trigger).
"""
import logging

# torch.utils.benchmark imports cpp_extension, which warns about CUDA_HOME on machines without CUDA:
# noise in every learner's output, and irrelevant to Python-level timing. Set before any grader
# module imports the benchmark.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
