"""A made-up lesson with no graded exercises (every lesson of the course has some now),
so tests can check what grading one says."""

EXERCISES = ()
