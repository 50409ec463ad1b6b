"""``python -m course_lib`` runs the same CLI as the ``course`` console script."""

from course_lib.course.cli import main

raise SystemExit(main())
