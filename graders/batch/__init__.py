"""Grading a tree's katas in pytest subprocesses, the way score.py, watch.py and organiser mode all do:
processes that share out the katas, the progress files they write, whether a process can vouch for its
katas, and a kata's summary (points per level, speedup, the first failing check's sentence).

May import: graders.frame. The grading itself runs in the subprocesses (graders.learner.pytest_plugin).
"""
