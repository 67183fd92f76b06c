"""The command line of score.py (graders/score.py is its entry point): arguments, and the dispatch between
a learner's run and an organiser's. watch.py's loop lives with the learner's tools, scan.py's scan with
isolation.

May import: everything below it (graders.learner, graders.competition, graders.batch, graders.isolation,
graders.frame).
"""
