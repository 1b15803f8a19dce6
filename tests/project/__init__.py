"""Tests of the project as a whole: its layout and import rules, the architecture map, the wheel, extending it."""
