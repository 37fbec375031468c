"""The command line: the kubectl plugin."""
