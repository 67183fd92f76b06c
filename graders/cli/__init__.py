"""The command lines behind the entry points graders/score.py, graders/watch.py and graders/scan.py:
argument parsing and the dispatch between a learner's run and an organiser's.

May import: everything below it (graders.learner, graders.competition, graders.batch, graders.frame).
"""
