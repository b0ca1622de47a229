import os
import sys

# Run against the installed package (pip install --no-build-isolation .), never the source tree:
# python/locks has no compiled library in it.
sys.path = [p for p in sys.path if os.path.abspath(p) != os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))]
