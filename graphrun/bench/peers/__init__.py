"""Other systems run as benchmark peers in the same run as graphrun, each under its own
Python (never imported by graphrun: they run as scripts, see :mod:`graphrun.bench.distdgl`)."""
