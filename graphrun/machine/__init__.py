"""What runs on one machine of a job, whichever backend started it: ``graphrun worker``
(:mod:`~graphrun.machine.worker`: launch plans, a supervisor, store readiness, usage) and
the trainer role (:mod:`~graphrun.machine.trainer`). The local backend starts one worker
per machine on this host; the operator runs one in every worker pod."""
