"""graphrun: distributed graph neural network training people can actually run."""

__version__ = "0.1.0"
