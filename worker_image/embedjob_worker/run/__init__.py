"""Stage `run`: one job's run wired from the stages — its start, lease, actors, feed, dispatch, writers — and its
end. The only stage that wires the others; nothing below imports it."""
