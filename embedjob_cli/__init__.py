"""The `embedjob` command a user runs: `run` (a job on this machine), `search`, `logs`, `render`.

The only code that imports both the operator's builders (`controller`) and the driver
(`embedjob_worker`); neither image needs it to run a job.
"""
