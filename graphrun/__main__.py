import sys

from graphrun.cli import main

code = main()
if sys.argv[1:2] in (["serve"], ["ps"], ["worker"]):  # roles: skip the slow finalisation
    from graphrun.machine.process import exit_now

    exit_now(code)
raise SystemExit(code)
