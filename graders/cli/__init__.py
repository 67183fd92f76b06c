"""The command lines behind the entry points graders/score.py, graders/watch.py and graders/scan.py:
argument parsing and the dispatch between a learner's run, an organiser's and a team's upload to a live
competition (graders.arena.client).

May import: everything below it (graders.arena, graders.learner, graders.competition, graders.batch, graders.frame).
"""
