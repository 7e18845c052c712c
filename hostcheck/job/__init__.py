"""``hostcheck job``: run the user's training command, watch it, and say what holds its GPUs back.

cli (the subcommand) -> observe (start the command through hostcheck.child.launch, sample /proc, /dev/shm and
NVML) -> records (the hook's files, written by hostcheck/inside/job_hook.py in the job's Pythons) -> analyse
(the figures) -> diagnosis (the rules and thresholds) -> render (text, JSON) and png (the timeline).
"""
