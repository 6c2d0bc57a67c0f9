"""Tests of learners.models: the built-in networks and network factories."""
