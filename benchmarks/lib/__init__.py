"""The parts of the benchmark scripts that are not scripts: shared measurement code, imported
as ``lib.<module>`` by the scripts one folder up (their folder is ``sys.path[0]`` when run)."""
