"""The core both backends share: the GraphJob spec, the workflow state machine, the rules
of blame and of elastic loss (:mod:`.blame`, :mod:`.elastic`), the hosts file, GPUs and
the spec as a placement job. The backends (:mod:`graphrun.local`,
:mod:`graphrun.operator`) sit beside each other above it and :mod:`graphrun.machine`."""
