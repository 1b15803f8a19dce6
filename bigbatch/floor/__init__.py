"""The floor: files and processes, below everything else (docs/architecture.md, "The floors").

It imports nothing of bigbatch's but ``errors.py``, and every other part may import it: atomic writes and torch
files read without running code (``files.py``), a user's files read as bounded regular files inside the folder named
(``user_files.py``), the run directory's file names (``run_files.py``), output checks
(``outputs.py``), whether a process is there (``processes.py``), the process group (``distributed.py``), the
shared-memory all-reduce (``host_all_reduce.py``) and a nested batch's tensors (``tensors.py``).
"""
