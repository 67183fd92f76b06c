"""Isolation: solution code runs apart from the judge, and is watched where it runs in process.

- worker.py and serve.py: the worker process (the only place solution code runs when grading is isolated)
  and the judge's handle on it; sandbox.py: bubblewrap and resource limits around it;
- records/: a rewritten GraphModule as data (encoded in the worker) and its rebuild in the judge;
- guard.py: the runtime guard (in-process grading); scan.py: the static scan of a solution tree.

May import: graders.frame. Never the run path: the worker is below the session that drives it.
"""
