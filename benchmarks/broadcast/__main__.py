"""python -m benchmarks.broadcast: see benchmarks/broadcast/run.py."""

from benchmarks.broadcast.run import main

main()
