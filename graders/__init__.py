"""Graders for the fx-katas: a shared harness plus one small grader module per kata."""
