"""The command line of score.py (graders/score.py is its entry point): arguments, and the dispatch between
a learner's run, an organiser's, and a team's upload to a live competition (graders.arena.client).
watch.py's loop lives with the learner's tools, scan.py's scan with isolation, arena.py's commands with
the arena.

May import: everything below it (graders.arena, graders.learner, graders.competition, graders.batch,
graders.isolation, graders.frame).
"""
