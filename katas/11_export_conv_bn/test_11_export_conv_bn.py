"""Grades this kata: uv run pytest katas/11_export_conv_bn   (add --solutions DIR to grade another tree)."""
from graders.learner.pytest_plugin import kata_level_tests

test_L1_pattern, test_L2_exact, test_L3_fast, test_L4_hidden = kata_level_tests("11_export_conv_bn")
