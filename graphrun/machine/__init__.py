"""What runs on one machine of a job, whichever backend started it."""
