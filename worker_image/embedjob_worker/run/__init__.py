"""Stage `run`: one job wired from the stages (lease, actors, feed, dispatch, writers) and its end.
The only stage that wires the others; nothing below imports it."""
