"""The embedding driver (runs as the RayJob entrypoint) and the `embedjob` CLI."""
