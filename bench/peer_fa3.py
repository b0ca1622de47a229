#!/usr/bin/env python3
"""LOCKS vs vLLM's FA3 paged decode on the kernel bench's rows (bench/peer/run.py says how)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the `peer` package beside it

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        from peer import worker

        sys.exit(worker.main())
    from peer import run

    sys.exit(run.main())
