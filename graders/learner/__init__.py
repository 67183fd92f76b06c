"""The learner's tools: the pytest front end (one test per check), the watch loop, progress and hints, and
the score table.

May import: graders.frame, graders.run, graders.isolation, graders.batch.
"""
