"""Launching and ending child processes: deadlines, process-group kill, token sweep, output to files."""
