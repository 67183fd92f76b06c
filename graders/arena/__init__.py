"""Live competitions: a submission service with a live leaderboard page (`uv run graders/arena.py serve`).

Teams upload their NN_name/solution.py files during the event (`score.py --submit URL --token TOKEN` or
the page's upload form); each submission is stored in the database before it is acknowledged, graded in
a background queue with the competition's secret seed (solution code only in sandboxed workers), and the
board at `/` moves as gradings finish. The organiser creates the competition, adds teams and closes it,
which exports results/ and LEADERBOARD.md in the organiser mode's formats and publishes the seed.

Modules: db (tables, tokens), uploads (what a team may upload), grading (the grading backend and the
queue), board (standings through the one ranking, redaction before the close, the export), graphs (a
recorded graph drawn as SVG), api (the JSON API), pages (the HTML pages), app (the web application),
cli (the arena.py commands), client (the team's `score.py --submit`).

May import: graders.frame, graders.isolation, graders.batch, graders.competition.
"""
