"""Competitions: organiser grading of every team's tree, the store of graded runs, the ranking and the
leaderboard generated from it.

May import: graders.frame, graders.isolation (the static scan, the sandbox's state), graders.batch.
"""
